"""The controller's one configuration (controller/conf.py), pure: built from the flags or a config file
with the same checks, every default in the dataclasses, written to the run directory and read back
unchanged by what the app reads."""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest
import yaml

from hpnlab.controller import conf, config
from hpnlab.fabric.emulation import controller_process
from hpnlab.fabric.errors import UserError


def parsed(argv: list[str]) -> argparse.Namespace:
    p = config.record_given(conf.build_parser())
    return config.resolve(p, p.parse_args(argv))


def test_with_no_flag_every_setting_is_the_dataclasses_default():
    built = conf.from_namespace(parsed(["mini-hpn"]))
    defaults = conf.ControllerConfig("mini-hpn")
    # the one file path with a default is made absolute (the app may run elsewhere)
    defaults = dataclasses.replace(defaults, wiring=dataclasses.replace(
        defaults.wiring, deployment_out=str(Path(conf.Wiring.deployment_out).resolve())))
    assert built == defaults


def test_the_flags_fill_their_sections():
    c = conf.from_namespace(parsed(["small-hpn", "--ofp-port", "7000", "--arp", "per-host", "--no-fast-failover",
                                    "--routing-weights", "weighted", "--ecn-policy", "dynamic", "--rollout", "staged",
                                    "--rollout-probe", "leaves", "--on-miswire", "planes", "--set", "planes=1"]))
    assert (c.scenario, c.overrides, c.openflow.port) == ("small-hpn", ("planes=1",), 7000)
    assert (c.routing.arp, c.routing.fast_failover, c.routing.weights) == ("per-host", False, "weighted")
    assert (c.ecn.policy, c.rollout.mode, c.rollout.probe, c.wiring.on_miswire) == ("dynamic", "staged", "leaves",
                                                                                      "planes")


def test_metrics_are_served_on_the_openflow_address_unless_an_address_of_their_own_is_given():
    assert conf.from_namespace(parsed(["mini-hpn", "--metrics-port", "9300"])).metrics == conf.Metrics(9300, None)
    own = conf.from_namespace(parsed(["mini-hpn", "--metrics-port", "6653", "--metrics-listen", "127.0.0.2"]))
    assert own.metrics == conf.Metrics(6653, "127.0.0.2")       # another address: the OpenFlow port is free there


def test_written_to_the_run_directory_it_reads_back_the_same(tmp_path):
    c = conf.from_namespace(parsed(["mini-hpn", "--metrics-port", "9300", "--metrics-listen", "127.0.0.1",
                                    "--telemetry-out", str(tmp_path / "t.jsonl"),
                                    "--deployment", "auto", "--rollout", "staged", "--set", "planes=1"]))
    path = conf.write(c, tmp_path)
    assert path == tmp_path / conf.FILE_NAME
    assert conf.read(path) == c


def test_the_written_file_names_every_setting_as_a_config_file_key():
    c = conf.ControllerConfig("mini-hpn")
    keys = set(conf.values(c))
    flags = set(config.keys_of(conf.build_parser())) - {"ssl_key", "ssl_cert", "ssl_ca", "run_dir"}
    assert keys == flags


def test_the_written_file_starts_the_same_controller_through_config(tmp_path):
    c = conf.from_namespace(parsed(["mini-hpn", "--ofp-port", "6700", "--policy", "host-routes"]))
    path = conf.write(c, tmp_path)
    assert conf.from_namespace(parsed(["--config", str(path)])) == c


@pytest.mark.parametrize(("argv", "needle"), [
    (["--deployment", "auto", "--on-miswire", "off"], "--deployment auto needs LLDP discovery"),
    (["--rollout", "staged", "--on-miswire", "off"], "--rollout staged needs LLDP discovery"),
    (["--routing-weights", "weighted", "--telemetry-interval-ms", "0"], "needs telemetry"),
    (["--json"], "--json only goes with --dry-run"),
    (["--metrics-port", "6653"], "--metrics-port must differ from --ofp-port"),
    (["--ssl-key", "k.pem"], "TLS needs --ssl-key, --ssl-cert and --ssl-ca together"),
])
def test_settings_that_do_not_go_together_are_one_line(argv, needle):
    with pytest.raises(UserError, match=needle) as err:
        conf.from_namespace(parsed(["mini-hpn", *argv]))
    assert "\n" not in str(err.value)


def test_the_app_reads_a_mistake_in_its_file_as_one_line(tmp_path):
    path = tmp_path / "controller.yaml"
    path.write_text(yaml.safe_dump({"scenario": "mini-hpn", "rollout_probe": "host", "telemetry_interval_ms": "x"}))
    with pytest.raises(UserError) as err:
        conf.read(path)
    assert "rollout_probe: 'host' is not one of hosts, leaves" in str(err.value) and "\n" not in str(err.value)


def test_check_names_what_the_settings_point_at_that_is_missing(tmp_path):
    c = conf.from_namespace(parsed(["mini-hpn", "--wiring-out", str(tmp_path / "no" / "w.json")]))
    with pytest.raises(UserError, match=r"--wiring-out .*its directory does not exist"):
        conf.check(c)
    c = conf.from_namespace(parsed(["mini-hpn", "--run-dir", str(tmp_path / "nope")]))
    with pytest.raises(UserError, match=r"--run-dir .*no such directory"):
        conf.check(c)


def test_the_emulation_passes_only_what_it_sets_and_names_its_run_and_run_directory(tmp_path):
    cmd = controller_process.command(tmp_path / "scenario.yaml", 6653, "127.0.0.1", run_dir=tmp_path,
                                     run_id="20261207-000000-abcdef",
                                     extra=controller_process.ecn_args(telemetry_out=tmp_path / "t.jsonl"))
    c = conf.from_namespace(parsed(cmd[3:]))
    assert c.run_dir == str(tmp_path) and c.ecn.stage_run == "20261207-000000-abcdef"
    assert (c.ecn.policy, c.ecn.telemetry_interval_ms) == (conf.Ecn.policy, conf.Ecn.telemetry_interval_ms)
    assert controller_process.CONFIG_FILE == conf.FILE_NAME
