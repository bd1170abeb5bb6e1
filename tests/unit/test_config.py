"""The controller's config file (controller/config.py), pure: keys are the parser's dests."""
from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from hpnlab.controller import config
from hpnlab.controller.__main__ import build_parser
from hpnlab.fabric.errors import UserError


def parser() -> argparse.ArgumentParser:
    return config.record_given(build_parser())


def resolved(doc: str | None, argv: list[str], tmp_path: Path, p: argparse.ArgumentParser | None = None):
    p = p or parser()
    if doc is not None:
        f = tmp_path / "controller.yaml"
        f.write_text(doc)
        argv = [*argv, "--config", str(f)]
    return config.resolve(p, p.parse_args(argv))


def test_every_key_takes_the_flags_type(tmp_path):
    args = resolved("scenario: mini-hpn\nofp_port: 6654\nlisten: 0.0.0.0\nmetrics_port: 9300\npolicy: host-routes\n"
                    "ecn_policy: dynamic\ntelemetry_interval_ms: 100\nno_fast_failover: true\n", [], tmp_path)
    assert (args.scenario, args.ofp_port, args.listen, args.metrics_port, args.policy, args.ecn_policy,
            args.telemetry_interval_ms, args.no_fast_failover) == (
        "mini-hpn", 6654, "0.0.0.0", 9300, "host-routes", "dynamic", 100.0, True)


def test_a_key_may_be_written_with_dashes_like_the_flag(tmp_path):
    assert resolved("scenario: mini-hpn\nofp-port: 7000\n", [], tmp_path).ofp_port == 7000


def test_tls_block_sets_the_three_ssl_flags(tmp_path):
    args = resolved("scenario: mini-hpn\ntls: {key: /k.pem, cert: /c.pem, ca: /ca.pem}\n", [], tmp_path)
    assert (args.ssl_key, args.ssl_cert, args.ssl_ca) == ("/k.pem", "/c.pem", "/ca.pem")


def test_set_as_a_mapping_becomes_set_items_the_scenario_parser_reads(tmp_path):
    from hpnlab.fabric.scenario import spec
    args = resolved("scenario: mini-hpn\nset: {emulation: {host_mbps: 20}, fabric.planes: 1}\n", [], tmp_path)
    assert spec.parse_overrides(args.set) == {"emulation": {"host_mbps": 20}, "fabric": {"planes": 1}}


def test_command_line_flags_win_over_the_file(tmp_path):
    args = resolved("scenario: mini-hpn\nofp_port: 6654\npolicy: host-routes\n",
                    ["small-hpn", "--ofp-port", "7001"], tmp_path)
    assert (args.scenario, args.ofp_port, args.policy) == ("small-hpn", 7001, "host-routes")


def test_a_flag_given_at_its_default_value_still_wins_over_the_file(tmp_path):
    args = resolved("scenario: mini-hpn\npolicy: host-routes\n", ["--policy", "aggregate"], tmp_path)
    assert args.policy == "aggregate"


def test_command_line_set_items_come_after_the_files_so_they_win(tmp_path):
    args = resolved("scenario: mini-hpn\nset: [a=1, b=2]\n", ["--set", "a=3"], tmp_path)
    assert args.set == ["a=1", "b=2", "a=3"]


def test_without_a_file_the_defaults_stand():
    p = parser()
    assert config.resolve(p, p.parse_args(["mini-hpn"])).ofp_port == 6653


def test_flags_another_module_adds_to_the_parser_are_keys_with_no_change(tmp_path):
    p = build_parser()
    p.add_argument("--site-map", metavar="FILE")
    p.add_argument("--on-trouble", choices=("refuse", "planes"), default="refuse")
    p.add_argument("--stages", choices=("all", "plane"), default="all")
    p.add_argument("--rehearse", action="store_true")
    config.record_given(p)
    args = resolved("scenario: mini-hpn\nsite_map: /etc/hpnlab/site.yaml\non_trouble: planes\nstages: plane\n"
                    "rehearse: true\n", [], tmp_path, p)
    assert (args.site_map, args.on_trouble, args.stages, args.rehearse) == (
        "/etc/hpnlab/site.yaml", "planes", "plane", True)


def test_the_flags_of_the_wiring_check_rollout_and_dry_run_are_config_keys(tmp_path):
    args = resolved("scenario: mini-hpn\ndeployment: /etc/hpnlab/site.yaml\non_miswire: planes\nrollout: staged\n"
                    "dry_run: true\n", [], tmp_path, build_parser())
    assert (args.deployment, args.on_miswire, args.rollout, args.dry_run) == (
        "/etc/hpnlab/site.yaml", "planes", "staged", True)


@pytest.mark.parametrize(("doc", "needle"), [
    ("ofp_prot: 1\n", "unknown key 'ofp_prot' (did you mean 'ofp_port'?)"),
    ("ofp_port: six\n", "ofp_port: expected a whole number (as --ofp-port), got 'six' (str)"),
    ("ofp_port: 66.5\n", "ofp_port: expected a whole number"),
    ("no_fast_failover: yes please\n", "no_fast_failover: expected true or false"),
    ("policy: fastest\n", "policy: 'fastest' is not one of aggregate, host-routes"),
    ("listen: 127\n", "listen: expected a string (as --listen), got 127 (int)"),
    ("tls: {key: a, crt: b}\n", "tls.crt: unknown key (known: key, cert, ca)"),
    ("tls: /etc/key.pem\n", "tls: expected a mapping (key, cert, ca)"),
    ("set: 3\n", "set: expected a mapping of scenario fields"),
    ("- a\n- b\n", "expected a mapping of settings"),
    ("ofp_port: [1\n", "not valid YAML"),
])
def test_a_mistake_in_the_file_is_one_line_naming_it(doc, needle, tmp_path):
    with pytest.raises(UserError) as err:
        resolved(doc, [], tmp_path)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_every_mistake_is_reported_at_once(tmp_path):
    with pytest.raises(UserError) as err:
        resolved("ofp_port: x\nmetrics_port: y\nbogus: 1\n", [], tmp_path)
    text = str(err.value)
    assert "ofp_port:" in text and "metrics_port:" in text and "unknown key 'bogus'" in text


def test_a_missing_file_is_one_line(tmp_path):
    p = parser()
    with pytest.raises(UserError, match="no such file"):
        config.resolve(p, p.parse_args(["--config", str(tmp_path / "nope.yaml")]))


def test_to_argv_gives_back_a_command_line_with_the_same_values(tmp_path):
    args = resolved("scenario: mini-hpn\nofp_port: 6654\nno_fast_failover: true\nset: {a: 1}\n"
                    "tls: {key: /k, cert: /c, ca: /ca}\ntelemetry_interval_ms: 50\n", ["-v"], tmp_path)
    argv = config.to_argv(build_parser(), args)
    again = build_parser().parse_args(argv)
    for dest in ("scenario", "ofp_port", "no_fast_failover", "set", "ssl_key", "ssl_cert", "ssl_ca",
                 "telemetry_interval_ms", "verbose"):
        assert getattr(again, dest) == getattr(args, dest), dest
    assert "--config" not in argv


def test_to_argv_leaves_out_what_is_at_its_default():
    assert config.to_argv(build_parser(), build_parser().parse_args(["mini-hpn"])) == ["mini-hpn"]


def test_null_stands_for_a_flag_not_given_where_the_flag_has_no_default(tmp_path):
    args = resolved("scenario: mini-hpn\nwiring_out: null\ndeployment: null\n", [], tmp_path)
    assert (args.wiring_out, args.deployment) == (None, None)
    with pytest.raises(UserError, match="ofp_port: expected a whole number"):
        resolved("scenario: mini-hpn\nofp_port: null\n", [], tmp_path)
