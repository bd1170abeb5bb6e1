"""The service files in the repository (controller/deploy/, controller/grafana/), pure: the example
config is a valid controller config, the systemd unit runs the controller with it, the Grafana
dashboard asks only for metrics the controller exports."""
from __future__ import annotations

import configparser
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.paths import REPO

from hpnlab.controller import actuators, config, ecn_policy
from hpnlab.controller.__main__ import build_parser
from hpnlab.controller.metrics import Metrics
from hpnlab.fabric.scenario import graph, spec

ROOT = REPO
DEPLOY = ROOT / "controller" / "deploy"
UNIT = DEPLOY / "hpnlab-controller.service"
DASHBOARD = ROOT / "controller" / "grafana" / "hpnlab-controller.json"


def example_args():
    p = config.record_given(build_parser())
    return config.resolve(p, p.parse_args(["--config", str(DEPLOY / "controller.yaml")]))


def unit() -> configparser.ConfigParser:
    c = configparser.ConfigParser(interpolation=None, strict=True)
    c.optionxform = str  # type: ignore[assignment,method-assign]   # systemd's keys are case-sensitive
    c.read_string(UNIT.read_text())
    return c


def test_the_example_config_has_only_known_keys_of_the_right_types():
    args = example_args()
    assert args.scenario and args.ofp_port == 6653 and args.metrics_port > 0


def test_the_example_configs_settings_pass_the_controllers_own_checks():
    args = example_args()
    g = graph.build(spec.load(args.scenario, spec.parse_overrides(args.set)))
    assert graph.switches(g)
    actuators.check_spec(args.ecn_actuator)
    ecn_policy.load(args.ecn_policy, g.graph["scenario"].emulation.mtu)


def test_the_example_config_turns_tls_on_with_all_three_files():
    args = example_args()
    assert all((args.ssl_key, args.ssl_cert, args.ssl_ca))


def test_the_unit_runs_the_controller_in_the_foreground_with_the_config_file():
    service = unit()["Service"]
    argv = shlex.split(service["ExecStart"])
    assert argv[0].endswith("/hpnlab") and argv[1:] == ["controller", "--config", "/etc/hpnlab/controller.yaml"]
    from hpnlab.cli.main import build_parser as hpnlab_parser
    parsed = hpnlab_parser().parse_args(argv[1:])
    assert parsed.config == "/etc/hpnlab/controller.yaml"
    assert service["Type"] == "simple" and service["Restart"] == "on-failure"
    assert service.get("StandardOutput") == "journal"


def test_the_unit_does_not_restart_on_a_config_mistake():
    assert unit()["Service"]["RestartPreventExitStatus"] == "2"     # UserError's exit code (cli/main.py)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verify_accepts_the_unit(tmp_path):
    hpnlab = Path(sys.executable).with_name("hpnlab")        # the unit's ExecStart must exist to be verified
    text = re.sub(r"^ExecStart=\S+", f"ExecStart={hpnlab}", UNIT.read_text(), flags=re.M)
    copy = tmp_path / UNIT.name
    copy.write_text(text)
    r = subprocess.run(["systemd-analyze", "verify", str(copy)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and not r.stderr.strip(), r.stderr


def exported_names() -> set[str]:
    """Every series name the controller's registry exports (a counter X as X_total and X_created)."""
    names = set()
    for family in Metrics().registry.collect():
        names |= {f"{family.name}_total", f"{family.name}_created"} if family.type == "counter" else {family.name}
    return names


def dashboard_exprs() -> list[str]:
    doc = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p["targets"]]
    exprs += [v["definition"] for v in doc["templating"]["list"] if "definition" in v]
    return exprs


def test_the_dashboard_is_json_with_unique_panel_ids_and_a_prometheus_datasource():
    doc = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids)) and doc["uid"] == "hpnlab-controller"
    assert {p["datasource"]["type"] for p in doc["panels"]} == {"prometheus"}


def test_every_metric_the_dashboard_asks_for_is_one_the_controller_exports():
    exported = exported_names()
    asked = {name for e in dashboard_exprs() for name in re.findall(r"\bhpnlab_[a-z_]+", e)}
    assert asked and asked <= exported, sorted(asked - exported)


def test_the_dashboard_covers_switches_flows_recompiles_packet_ins_and_health():
    asked = " ".join(dashboard_exprs())
    for name in ("hpnlab_switches_connected", "hpnlab_switches_expected", "hpnlab_switch_flows",
                 "hpnlab_recompiles_total", "hpnlab_packet_ins_total", "hpnlab_healthy", "hpnlab_failed_links"):
        assert name in asked, name
