"""An emulation's options (hpnlab.fabric.emulation.options) as one typed value, checked once, written and read
back as plain data; the controller's settings made from them in one place (supervisor.controller_args); the
harness split into builder, controller supervisor and fault API; the CLI's flags turned into them (pure)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpnlab.fabric.emulation import Emulation, EmulationOptions
from hpnlab.fabric.emulation.options import (
    ClusterOptions,
    ControllerOptions,
    FailoverOptions,
    OptionsError,
    PortOptions,
    SupervisionOptions,
)
from hpnlab.fabric.emulation.rewire import Rewire
from hpnlab.fabric.emulation.supervisor import ControllerFiles, controller_args
from hpnlab.fabric.errors import UserError
from hpnlab.fabric.scenario import spec


def test_the_defaults_are_a_run_with_the_hpnlab_controller_shaping_ecn_and_reachability_checked():
    o = EmulationOptions()
    assert (o.controller.kind, o.ports.shape, o.ports.ecn, o.supervision.verify) == ("hpnlab", True, True, True)
    assert (o.failover.bfd_ms, o.cluster.servers, bool(o.rewire)) == (0, (), False)


def test_every_bad_value_is_one_line_and_all_are_told_at_once():
    with pytest.raises(OptionsError) as exc:
        EmulationOptions(controller=ControllerOptions(arp="per-leaf", on_loss="die", routing_weights="spread"),
                         ports=PortOptions(port_type="dpdk", ovs_sched="fifo"),
                         failover=FailoverOptions(bfd_ms=-1), cluster=ClusterOptions(placement="anywhere"))
    problems = exc.value.problems
    assert len(problems) == 7 and all("\n" not in p for p in problems)
    for words in ("--arp 'per-leaf'", "--on-controller-loss 'die'", "routing weights 'spread'", "--port-type",
                  "ovs_sched", "BFD interval", "placement 'anywhere'"):
        assert sum(words in p for p in problems) == 1, words
    assert isinstance(exc.value, UserError) and str(exc.value) == "; ".join(problems)


@pytest.mark.parametrize("controller,words", [
    (ControllerOptions(kind="ryu"), "unknown controller 'ryu'"),
    (ControllerOptions(kind="none", routing_weights="weighted"), "need the hpnlab controller"),
    (ControllerOptions(kind="none", ecn_policy="dynamic"), "needs the hpnlab controller"),
    (ControllerOptions(kind="none", tls_dir="/nonexistent"), "--controller-tls needs the hpnlab controller"),
    (ControllerOptions(tls_dir="/nonexistent/tls"), "no such directory"),
])
def test_a_controller_option_the_controller_cannot_honour_is_refused(controller, words):
    with pytest.raises(OptionsError, match=words):
        EmulationOptions(controller=controller)


def test_the_options_read_back_from_plain_data_are_the_same():
    o = EmulationOptions(controller=ControllerOptions(arp="per-host", extra_args=("--metrics-port", "9"),
                                                      inactivity_probe_ms=9000, on_loss="restart"),
                         ports=PortOptions(ecn=False, port_type="system"), failover=FailoverOptions(bfd_ms=50),
                         supervision=SupervisionOptions(lock_wait_s=300, verify_branches=True),
                         cluster=ClusterOptions(servers=("localhost",)),
                         rewire=Rewire(swap=[(("p0l0", "p0s0"), ("p0l1", "p0s1"))], drop=[("p0l2", "p0s0")],
                                       port_offset=100))
    data = json.loads(json.dumps(o.as_dict()))
    assert EmulationOptions.from_dict(data) == o


@pytest.mark.parametrize("group,words", [
    (lambda: {"controller": ControllerOptions(ofp_port=70000)}, "OpenFlow port must be 1-65535, got 70000"),
    (lambda: {"controller": ControllerOptions(telemetry_interval_ms=-5)}, "telemetry interval must be >= 0 ms"),
    (lambda: {"controller": ControllerOptions(ready_timeout_s=0)}, "ready_timeout_s must be > 0 s, got 0"),
    (lambda: {"controller": ControllerOptions(connect_timeout_s=-1)}, "connect_timeout_s must be > 0 s"),
    (lambda: {"controller": ControllerOptions(inactivity_probe_ms=0)}, "inactivity probe must be >= 1 ms"),
    (lambda: {"failover": FailoverOptions(bfd_ms=50, bfd_mult=0)}, "multiplier 1-255, got 50, 0"),
    (lambda: {"supervision": SupervisionOptions(lock_wait_s=-1)}, "lock wait must be >= 0 s, got -1"),
    (lambda: {"ports": PortOptions(port_type="dpdk")}, "--port-type must be one of"),
    (lambda: {"ports": PortOptions(ovs_sched="fifo")}, "ovs_sched must be one of"),
    (lambda: {"cluster": ClusterOptions(placement="anywhere")}, "unknown placement 'anywhere'"),
], ids=["ofp_port", "telemetry", "ready", "connect", "probe", "bfd_mult", "lock", "port_type", "ovs_sched",
        "placement"])
def test_a_bad_value_is_a_user_error_of_one_line_naming_it(group, words):
    with pytest.raises(UserError) as exc:
        EmulationOptions(**group())
    assert isinstance(exc.value, OptionsError) and exc.value.problems == [str(exc.value)]
    assert "\n" not in str(exc.value)
    assert words in str(exc.value)


def test_a_group_of_the_wrong_type_is_one_line():
    with pytest.raises(OptionsError, match=r"^options.ports must be PortOptions, got ") as exc:
        EmulationOptions(ports={"ecn": False})
    assert len(exc.value.problems) == 1


def test_good_edge_values_are_accepted():
    o = EmulationOptions(
        controller=ControllerOptions(ofp_port=65535, telemetry_interval_ms=0, inactivity_probe_ms=1),
        failover=FailoverOptions(bfd_ms=0, bfd_mult=255), supervision=SupervisionOptions(lock_wait_s=0))
    assert o.controller.telemetry_interval_ms == 0 and o.failover.bfd_mult == 255


def test_options_from_plain_data_name_each_unknown_or_mistyped_value():
    with pytest.raises(OptionsError) as exc:
        EmulationOptions.from_dict({"controller": {"knd": "hpnlab", "fast_failover": "no"}, "portz": {},
                                    "supervision": {"lock_wait_s": "long"}})
    problems = exc.value.problems
    assert any("unknown options group 'portz'" in p for p in problems)
    assert any("unknown option controller.'knd'" in p for p in problems)
    assert any("option controller.fast_failover must be like True" in p for p in problems)
    assert any("option supervision.lock_wait_s" in p for p in problems)


def test_a_group_left_out_keeps_its_defaults():
    o = EmulationOptions.from_dict({"ports": {"ecn": False}})
    assert o == EmulationOptions(ports=PortOptions(ecn=False))


# ---- the controller's settings, made in one place ---------------------------------------------

def files(tmp: Path, **kw) -> ControllerFiles:
    return ControllerFiles.in_dir(tmp, **{"staged": False, "weights": False, "deployment": False, **kw})


def test_the_controller_is_told_its_telemetry_wiring_and_the_options_own_flags(tmp_path):
    args = controller_args(ControllerOptions(ecn_policy="dynamic", telemetry_interval_ms=100), files(tmp_path), None)
    assert args[:4] == ["--ecn-policy", "dynamic", "--telemetry-interval-ms", "100"]
    assert args[args.index("--telemetry-out") + 1] == str(tmp_path / "telemetry.jsonl")
    assert args[args.index("--wiring-out") + 1] == str(tmp_path / "wiring.json")
    assert args[-2:] == ["--arp", "gateway"]
    assert "--no-fast-failover" not in args and "--rollout-out" not in args and "--ssl-key" not in args


def test_the_users_arguments_come_after_the_runs_and_before_what_the_options_add(tmp_path):
    o = ControllerOptions(extra_args=("--metrics-port", "9"), fast_failover=False, routing_weights="weighted")
    args = controller_args(o, files(tmp_path, weights=True), None)
    assert args[-7:] == ["--metrics-port", "9", "--no-fast-failover", "--arp", "gateway", "--routing-weights",
                         "weighted"]
    assert args[args.index("--weights-control") + 1] == str(tmp_path / "routing-weights.json")


def test_a_staged_rollout_and_a_foreign_deployment_get_their_files(tmp_path):
    args = controller_args(ControllerOptions(), files(tmp_path, staged=True, deployment=True), None)
    assert args[args.index("--rollout-out") + 1] == str(tmp_path / "rollout.json")
    assert args[args.index("--deployment") + 1] == str(tmp_path / "deployment.yaml")


def test_tls_gives_the_controller_its_key_certificate_and_ca(tmp_path):
    tls = {"controller_key": "k", "controller_cert": "c", "ca": "a"}
    args = controller_args(ControllerOptions(), files(tmp_path), tls)
    assert args[args.index("--ssl-key") + 1] == "k" and args[args.index("--ssl-ca") + 1] == "a"


# ---- the harness: the scenario as given, three collaborators ---------------------------------------

def test_the_emulation_takes_the_scenario_object_as_it_is():
    scenario = spec.load("mini-hpn", {"emulation": {"host_mbps": 3}})
    emu = Emulation(scenario, log=None)
    assert emu.scenario is scenario and emu.graph.graph["scenario"] is scenario


def test_the_emulation_is_its_builder_controller_supervisor_and_fault_api():
    emu = Emulation("mini-hpn", EmulationOptions(controller=ControllerOptions(on_loss="restart")), log=None)
    assert emu.faults.controller is emu.controller and emu.controller.switches is emu.builder
    assert emu.controller.on_loss == "restart" and emu.controller.active
    assert emu.builder.graph is emu.graph and emu.builder.physical is emu.graph     # cabled as planned
    assert emu.controller.telemetry_file is None and emu.controller.proc is None    # not started


def test_a_rewired_fabric_is_built_from_its_physical_graph():
    rewire = Rewire(drop=[("p0l0", "p0s0")])
    emu = Emulation("mini-hpn", EmulationOptions(rewire=rewire), log=None)
    assert emu.builder.physical is not emu.graph
    assert emu.builder.physical.number_of_edges() == emu.graph.number_of_edges() - 1


def test_a_fault_on_a_run_without_a_controller_process_is_one_line():
    emu = Emulation("mini-hpn", EmulationOptions(controller=ControllerOptions(kind="none")), log=None)
    with pytest.raises(UserError, match="no hpnlab controller to kill"):
        emu.faults.kill_controller()


# ---- the command line: flags declared once, turned into options once -------------------------------

def parse(argv: list[str]):
    from hpnlab.cli.main import build_parser
    return build_parser().parse_args(argv)


def test_emulate_flags_become_the_options_they_name():
    from hpnlab.cli.args import emulation_options
    args = parse(["emulate", "mini-hpn", "--controller", "none", "--no-ecn", "--no-verify", "--bfd", "--bfd-mult",
                  "5", "--ovs-sched", "off", "--servers", "localhost,node2", "--placement", "round-robin",
                  "--controller-ip", "192.0.2.1", "--ofp-port", "6700", "--on-controller-loss", "stop",
                  "--port-type", "system"])
    o = emulation_options(args)
    assert (o.controller.kind, o.controller.listen, o.controller.ofp_port, o.controller.on_loss) == (
        "none", "192.0.2.1", 6700, "stop")
    assert (o.ports.ecn, o.ports.shape, o.ports.ovs_sched, o.ports.port_type) == (False, True, "off", "system")
    assert (o.failover.bfd_ms, o.failover.bfd_mult, o.supervision.verify) == (50, 5, False)
    assert (o.cluster.servers, o.cluster.placement) == (("localhost", "node2"), "round-robin")


def test_emulates_lock_wait_becomes_the_supervisions_and_run_waits_not():
    from hpnlab.cli.args import emulation_options
    assert emulation_options(parse(["emulate", "mini-hpn", "--lock-wait", "120"])).supervision.lock_wait_s == 120
    assert emulation_options(parse(["run", "mini-hpn"])).supervision.lock_wait_s == 0


def test_runs_rank_placement_is_not_taken_for_a_cluster_placement():
    from hpnlab.cli.args import emulation_options
    o = emulation_options(parse(["run", "mini-hpn", "--placement", "same-rail", "--arp", "per-host"]),
                          routing_weights="weighted")
    assert o.cluster == ClusterOptions() and o.controller.arp == "per-host"
    assert o.controller.routing_weights == "weighted" and o.controller.on_loss == "restart"


@pytest.mark.parametrize("argv", [["topo", "inspect"], ["topo", "export"], ["topo", "plan"], ["check"], ["model"],
                                  ["fidelity"], ["doctor"], ["emulate"], ["run"], ["demo"], ["web", "model"]])
def test_every_command_that_takes_a_scenario_takes_it_and_set_the_same_way(argv):
    extra = ["--out", "x.json"] if argv == ["web", "model"] else []
    args = parse([*argv, "mini-hpn", "--set", "planes=1", "--set", "emulation.host_mbps=5", *extra])
    assert args.scenario == "mini-hpn" and args.overrides == ["planes=1", "emulation.host_mbps=5"]


def test_a_bad_emulation_flag_is_one_line_before_anything_is_built(capsys):
    from hpnlab.cli.main import main
    assert main(["emulate", "mini-hpn", "--controller", "ryu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["hpnlab: unknown controller 'ryu' (known: hpnlab, none)"]


@pytest.mark.parametrize("argv,words", [
    (["emulate", "mini-hpn", "--bfd", "-1"], "BFD interval must be >= 0 ms"),
    (["emulate", "mini-hpn", "--ofp-port", "0"], "OpenFlow port must be 1-65535, got 0"),
    (["run", "mini-hpn", "--telemetry-interval-ms", "-5"], "telemetry interval must be >= 0 ms"),
])
def test_a_bad_emulation_number_on_the_command_line_is_one_line(argv, words, capsys):
    from hpnlab.cli.main import main
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hpnlab: ") and words in err[0]
