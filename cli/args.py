"""Arguments several commands share, declared once: the scenario and ``--set`` (declared in
``hpnlab.fabric.scenario.arguments``, which the controller's launcher uses too), and the emulation's
options (``hpnlab emulate`` and ``hpnlab run``), with the one function that turns them into an
``EmulationOptions`` value."""
from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING, Any

import networkx as nx

from hpnlab.fabric.errors import short
from hpnlab.fabric.scenario import arguments, graph, spec
from hpnlab.fabric.scenario.arguments import add_scenario_args, overrides_of

__all__ = ["add_emulation_args", "add_pfc_arg", "add_scenario_args", "emulation_options", "load_fabric",
           "load_scenario", "overrides_of", "pfc_value", "pfc_values"]

if TYPE_CHECKING:     # the options module is loaded when a command emulates, not for every command's parser
    from hpnlab.fabric.emulation.options import EmulationOptions

#: ``--bfd`` without a value (ms). Without ovs-vswitchd real-time, 20 ms flapped about once per
#: port in 30 s at a load average near 6; with it, 10-20 ms held on an idle fabric, but under the
#: probe's traffic one repetition in five rerouted spuriously; 50 ms never did (README: failures)
DEFAULT_BFD_MS = 50


# ---- the scenario ------------------------------------------------------------------------------

def load_scenario(args: argparse.Namespace) -> spec.Scenario:
    """The scenario the arguments name, with their ``--set`` overrides."""
    return arguments.load(args)


def load_fabric(args: argparse.Namespace) -> tuple[spec.Scenario, nx.MultiGraph]:
    """The scenario the arguments name and its fabric graph."""
    scenario = load_scenario(args)
    return scenario, graph.build(scenario)


# ---- the emulation's options ----------------------------------------------------------------------

def add_port_type_arg(p: argparse.ArgumentParser) -> None:
    """``--port-type``."""
    from hpnlab.fabric.emulation.kernel import PORT_TYPE_CHOICES, PORT_TYPE_ENV
    p.add_argument("--port-type", choices=PORT_TYPE_CHOICES, default=None,
                   help=f"switch port type on the userspace datapath: system (AF_PACKET), afxdp, afxdp-nonpmd "
                        f"(AF_XDP), or auto (default; ${PORT_TYPE_ENV} too): AF_XDP where it works here and the "
                        f"run needs no switch-port shaping or ECN (AF_XDP bypasses tc egress)")


def add_arp_arg(p: argparse.ArgumentParser) -> None:
    """``--arp``: how the controller's leaves answer ARP."""
    from hpnlab.fabric.routing.compiler import ARP_MODES
    p.add_argument("--arp", choices=ARP_MODES, default="gateway",
                   help="how the leaves answer ARP in the switch, also while the controller is away: gateway "
                        "(default: one gateway MAC, two flows per host port; needs Open vSwitch's move action) or "
                        "per-host (each peer's own MAC, set-field only; any OpenFlow 1.3 switch)")


#: what ``--pfc`` takes
PFC_CHOICES = ("on", "off")


def add_pfc_arg(p: argparse.ArgumentParser, several: bool = False) -> None:
    """``--pfc on|off`` (with ``several``, a comma list such as ``on,off``): priority flow control and the
    shared switch buffer (``PortOptions.pfc``; default: the scenario's ``emulation.lossless.pfc``;
    docs/guides/lossless.md)."""
    p.add_argument("--pfc", type=pfc_values if several else pfc_value, default=None,
                   metavar="on|off" + ("[,...]" if several else ""),
                   help="priority flow control: switches pause their upstream above Xoff instead of dropping "
                        "(default: the scenario's emulation.lossless.pfc)" + ("; on,off runs both" if several else ""))


def pfc_value(text: str) -> bool:
    """``on`` or ``off`` as a bool (anything else: one usage line)."""
    t = text.strip().lower()
    if t not in PFC_CHOICES:
        raise argparse.ArgumentTypeError(f"--pfc takes on or off, got {short(text)}")
    return t == "on"


def _one_pfc(value: bool | tuple[bool, ...] | None) -> bool | None:
    """``--pfc`` of a command that takes several (``several``): its first (the command runs the others)."""
    return value[0] if isinstance(value, tuple) else value


def pfc_values(text: str) -> tuple[bool, ...]:
    """A comma list of ``on`` and ``off``, each setting once, in order."""
    values = tuple(dict.fromkeys(pfc_value(t) for t in text.split(",") if t.strip()))
    if not values:
        raise argparse.ArgumentTypeError("--pfc takes on, off or on,off")
    return values


def add_emulation_args(p: argparse.ArgumentParser, on_controller_loss: str = "continue",
                       ecn_policy_help: str = "", several_pfc: bool = False) -> None:
    """The controller's and the ports' options every command that emulates takes (``emulation_options``
    reads them). ``on_controller_loss``: this command's default answer to a dead controller; ``several_pfc``:
    ``--pfc`` takes ``on,off`` (the command runs once per value and sets ``args.pfc`` to each in turn)."""
    from hpnlab.fabric.emulation.options import ON_CONTROLLER_LOSS, ROUTING_WEIGHTS, ControllerOptions, FailoverOptions
    c = ControllerOptions()            # the flags' defaults are the options' own
    loss_help = {
        "continue": "say so and continue (default: the switches keep their tables, fail mode secure, and answer "
                    "ARP themselves), restart it (it reads the switches back and changes only what differs), or stop",
        "restart": "restart it (default: it reads the switches back and changes only what differs; traffic keeps "
                   "flowing meanwhile), stop the run, or say so and continue without it"}
    p.add_argument("--controller", default=c.kind, metavar="NAME",
                   help="hpnlab (default: the project's OpenFlow 1.3 controller) or none "
                        "(standalone switches; loop-free fabrics only)")
    p.add_argument("--policy", help="controller routing policy (aggregate or host-routes)")
    p.add_argument("--no-fast-failover", action="store_true",
                   help="no local protection (fast-failover groups keep only their primary bucket): "
                        "the controller-only baseline")
    p.add_argument("--no-ecn", action="store_true", help="no ECN marking stage on switch ports")
    p.add_argument("--ecn-policy", default=c.ecn_policy, metavar="NAME",
                   help=f"the controller's dynamic-ECN policy: static, dynamic, pfc-aware, MODULE:CLASS or FILE.py "
                        f"(default {c.ecn_policy})"
                        + ecn_policy_help)
    p.add_argument("--telemetry-interval-ms", type=int, default=c.telemetry_interval_ms, metavar="N",
                   help=f"the controller polls port statistics and the ECN stage every N ms (default "
                        f"{c.telemetry_interval_ms})")
    p.add_argument("--routing-weights", choices=ROUTING_WEIGHTS, default=c.routing_weights,
                   help="the switches' multipath weights: ecmp (default, equal) or weighted (the controller moves "
                        "entropy patterns off loaded uplinks every telemetry interval)")
    p.add_argument("--on-controller-loss", choices=ON_CONTROLLER_LOSS, default=on_controller_loss,
                   help="when the controller process dies: " + loss_help[on_controller_loss])
    p.add_argument("--bfd", type=int, nargs="?", default=FailoverOptions().bfd_ms, const=DEFAULT_BFD_MS, metavar="MS",
                   help=f"BFD on every switch-to-switch port, min_rx = min_tx = MS (default off; --bfd alone: "
                        f"{DEFAULT_BFD_MS} ms, the shortest that never flapped on a busy 2-core machine); a port whose "
                        f"BFD session fails stops being live (controller and fast-failover groups follow it)")
    p.add_argument("--controller-tls", metavar="DIR",
                   help="OpenFlow over TLS with the files tools/scripts/make_test_ca.sh writes into DIR (Open "
                        "vSwitch's machine-wide SSL setting is replaced for the run and put back after)")
    add_port_type_arg(p)
    add_arp_arg(p)
    add_pfc_arg(p, several=several_pfc)


def emulation_options(args: argparse.Namespace, extra_args: list[str] | tuple[str, ...] = (),
                      **controller: Any) -> EmulationOptions:
    """The ``EmulationOptions`` the arguments ask for (the flags a command does not take keep their
    defaults); ``extra_args``: more controller arguments (e.g. the web view's ``--metrics-port``);
    ``controller``: controller options the command decides itself (e.g. ``routing_weights``)."""
    from hpnlab.fabric.emulation import options as o

    def get(name: str, default: Any) -> Any:
        return getattr(args, name, default)

    c, ports, failover, supervision, cluster = (o.ControllerOptions(), o.PortOptions(), o.FailoverOptions(),
                                                o.SupervisionOptions(), o.ClusterOptions())
    servers = get("servers", None)
    ctl = o.ControllerOptions(
        kind=get("controller", c.kind), ofp_port=get("ofp_port", c.ofp_port), listen=get("controller_ip", c.listen),
        policy=get("policy", c.policy), tls_dir=get("controller_tls", c.tls_dir),
        routing_weights=get("routing_weights", c.routing_weights), arp=get("arp", c.arp),
        fast_failover=not get("no_fast_failover", not c.fast_failover), ecn_policy=get("ecn_policy", c.ecn_policy),
        telemetry_interval_ms=get("telemetry_interval_ms", c.telemetry_interval_ms),
        on_loss=get("on_controller_loss", c.on_loss), extra_args=tuple(extra_args))
    return o.EmulationOptions(
        controller=dataclasses.replace(ctl, **controller) if controller else ctl,
        ports=o.PortOptions(shape=ports.shape, ecn=not get("no_ecn", not ports.ecn),
                            port_type=get("port_type", ports.port_type), ovs_sched=get("ovs_sched", ports.ovs_sched),
                            pfc=_one_pfc(get("pfc", ports.pfc))),
        failover=o.FailoverOptions(bfd_ms=get("bfd", failover.bfd_ms), bfd_mult=get("bfd_mult", failover.bfd_mult)),
        supervision=o.SupervisionOptions(lock_wait_s=max(0.0, get("lock_wait", supervision.lock_wait_s)),
                                         verify=not get("no_verify", not supervision.verify),
                                         verify_branches=get("verify_branches", supervision.verify_branches)),
        cluster=o.ClusterOptions(servers=tuple(servers.split(",")) if servers else cluster.servers,
                                 placement=get("cluster_placement", cluster.placement)))
