"""The documentation site (docs/, mkdocs.yml): its reference pages are generated from the code and
cover all of it, the architecture page's diagram is the layer table the code is held to, every
result record is listed in the results index, newest first, and the README stays a front door."""
from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from types import ModuleType

import pytest
import yaml
from support.layers import LAYERS, SIDEWAYS
from support.paths import REPO, SCRIPTS

from hpnlab.cli.main import build_parser
from hpnlab.fabric.scenario import spec

DOCS = REPO / "docs"
RESULTS = DOCS / "results"
RECORD = re.compile(r"^(\d{4}-\d{2}-\d{2})-[a-z0-9-]+\.md$")


def _generator() -> ModuleType:
    loaded = importlib.util.spec_from_file_location("docs_reference", SCRIPTS / "docs_reference.py")
    assert loaded is not None and loaded.loader is not None
    module = importlib.util.module_from_spec(loaded)
    sys.modules["docs_reference"] = module          # as an import does: its dataclass looks its module up
    loaded.loader.exec_module(module)
    return module


REF = _generator()


def _commands(parser: argparse.ArgumentParser, path: list[str]) -> list[tuple[list[str], argparse.ArgumentParser]]:
    out = [(path, parser)]
    for name, sub in REF._subparsers(parser).items():
        out += _commands(sub, path + [name])
    return out


def test_the_cli_page_has_every_command_and_every_option_the_parser_has():
    page = REF.cli_page()
    commands = _commands(build_parser(), ["hpnlab"])
    assert len(commands) > 12
    for path, parser in commands[1:]:
        assert f"# `{' '.join(path)}`" in page, path
        for action in parser._actions:
            if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
                continue
            for option in action.option_strings:
                assert f"`{option}" in page or f", {option}" in page, (path, option)


def test_the_scenario_page_has_every_field_of_the_schema_with_its_default():
    page = REF.scenario_page()
    schema = spec.json_schema()
    for name, prop in schema["properties"].items():
        assert f"| `{name}` |" in page
        for sub in prop.get("properties", {}):
            assert f"| `{name}.{sub}` |" in page
    assert "| `emulation.host_mbps` |" in page and REF.scenario_defaults()["kind"] == "hpn"


def test_the_metrics_page_has_every_metric_the_controller_registers():
    pytest.importorskip("prometheus_client")
    from hpnlab.controller.metrics import Metrics
    from hpnlab.controller.pfc_metrics import families
    registered = {family.name for family in Metrics().registry.collect()}
    registered |= {family.name for family in families({}, {}, {"cpu_s": 0.0})}     # while PFC runs
    page = REF.metrics_page()
    for name in registered:
        assert f"`{name}`" in page or f"`{name}_total`" in page, name
    assert len(REF.metric_docs()) == len(registered)


def test_the_controller_configuration_page_has_every_launcher_flag_and_its_file_key():
    from hpnlab.controller import config
    from hpnlab.controller.__main__ import build_parser as controller_parser
    parser = controller_parser()
    page = REF.controller_config_page()
    for dest, action in config.keys_of(parser).items():
        if action.help == argparse.SUPPRESS:
            continue
        assert any(f"`{o}" in page for o in action.option_strings) or f"`{dest}`" in page, dest
    assert "| `tls.key` |" in page and "## `ControllerConfig`" in page and "## `OpenFlow`" in page


def test_every_row_of_a_generated_table_has_as_many_cells_as_its_header():
    for path, text in REF.pages().items():
        width = 0
        for line in text.splitlines():
            if not line.startswith("|"):
                width = 0
                continue
            cells = len(re.split(r"(?<!\\)\|", line)) - 2
            if width == 0:
                width = cells
            assert cells == width, (path, line)


def _diagram() -> str:
    page = (DOCS / "architecture.md").read_text()
    block = re.search(r"```text\n(.*?)```", page, re.S)
    assert block, "docs/architecture.md: no ```text diagram"
    return block.group(1)


def test_the_architecture_diagram_puts_every_package_on_its_layer():
    drawn: dict[str, int] = {}
    for line in _diagram().splitlines():
        row = re.match(r"\s*(\d)\s", line)
        if row:
            for pkg in re.findall(r"hpnlab(?:\.[a-z_]+)*", line):
                drawn[pkg] = int(row.group(1))
    assert drawn == LAYERS


def test_the_architecture_diagram_draws_exactly_the_sideways_imports_allowed():
    arrows = set(re.findall(r"(hpnlab(?:\.[a-z_]+)*)\s*─+►\s*(hpnlab(?:\.[a-z_]+)*)", _diagram()))
    assert arrows == SIDEWAYS


def test_the_architecture_page_has_the_layer_table():
    page = (DOCS / "architecture.md").read_text()
    for pkg, layer in LAYERS.items():
        assert re.search(rf"\|\s*{layer}\s*\|[^\n]*`{re.escape(pkg)}`", page), pkg


def _records() -> list[str]:
    return sorted((p.name for p in RESULTS.glob("*.md") if RECORD.match(p.name)), reverse=True)


def test_every_result_record_is_dated_and_says_its_command_commit_machine_load_and_data():
    records = _records()
    assert len(records) >= 20
    for name in records:
        text = (RESULTS / name).read_text()
        for field in ("command", "commit", "machine", "load", "data"):
            assert re.search(rf"^\|\s*{field}\s*\|", text, re.M | re.I), (name, field)


def test_the_results_index_lists_every_record_newest_first():
    index = (RESULTS / "index.md").read_text()
    linked = re.findall(r"\]\((\d{4}-\d{2}-\d{2}-[^)#/]+\.md)\)", index)
    assert sorted(linked) == sorted(_records()), "docs/results/index.md: add or remove a record's line"
    dates = [RECORD.match(n).group(1) for n in linked]  # type: ignore[union-attr]
    assert dates == sorted(dates, reverse=True)


def test_every_page_in_the_sites_navigation_exists_or_is_generated():
    config = yaml.load((REPO / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)

    def pages(nav: list) -> list[str]:
        out: list[str] = []
        for item in nav:
            value = next(iter(item.values())) if isinstance(item, dict) else item
            out += pages(value) if isinstance(value, list) else [value]
        return out
    generated = set(REF.PAGES)
    for page in pages(config["nav"]):
        assert page in generated or (DOCS / page).is_file(), page


def test_the_readme_is_a_front_door_of_at_most_250_lines_whose_links_resolve():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):
        assert (REPO / target).exists(), target
