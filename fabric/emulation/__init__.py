"""Run a scenario as a live emulated fabric: Mininet hosts, real Open vSwitch, a controller process.

Python API (stable; tools and tests build on it)::

    from hpnlab.fabric.emulation import Emulation, EmulationOptions
    from hpnlab.fabric.emulation.options import ControllerOptions, FailoverOptions, PortOptions

    scenario = spec.load("mini-hpn", {"emulation": {"host_mbps": 10}})   # or prepare(...).scenario
    options = EmulationOptions(                  # every group optional; checked when made (one line per bad value)
        controller=ControllerOptions(kind="hpnlab",   # or "none" (loop-free fabrics only, standalone OVS)
                                     ofp_port=None,   # None: 6653, or a free port if 6653 is taken
                                     policy=None),    # passed to the controller as --policy
        ports=PortOptions(ecn=True, shape=True))
    with Emulation(scenario, options) as emu:
        emu.net                      # the mininet.net.Mininet object
        emu.graph, emu.scenario      # the fabric graph and the Scenario it was given (not loaded again)
        emu.options                  # the EmulationOptions (also in the run directory: options.json)
        emu.host("h1")               # a Mininet host; .cmd(), .popen()
        emu.ip("h3", plane=1)        # planned address of h3's port on plane 1 (rail 0)
        emu.interfaces("h3")         # [{name, ip, cidr, plane, rail, mac, leaf, ...}]
        emu.ping_all()               # {"pairs": n, "failed": [(src, sip, dst, dip), ...]}
        emu.walk_branches()          # UDP probes on every entropy branch of every pair (see .reachability)
        emu.popen("h1", ["iperf3", "-s"])   # recorded; ended at exit even after SIGKILL + clean
        # the fault API (emu.faults, hpnlab.fabric.emulation.faults):
        t = emu.faults.link_down("p0l0", "p0s1")   # both ends down; returns the time applied
        emu.faults.link_down("p0l0", "p0s1", side="p0s1")   # one-sided: only p0s1's end
        emu.faults.link_up("p0l0", "p0s1"); emu.faults.switch_down("p1s0"); emu.faults.switch_up("p1s0")
        emu.faults.link_drop("p0l0", "p0s1", side="p0l0")   # gray: p0l0's egress drops all, carrier stays
        emu.faults.link_restore("p0l0", "p0s1", side="p0l0")
        emu.faults.run_timeline("failures.yaml")   # see hpnlab.fabric.emulation.timeline
        # the controller supervisor (emu.controller, hpnlab.fabric.emulation.supervisor):
        emu.controller.kill(); emu.controller.restart()   # a crash, and the controller back (switches reconnect)
        emu.controller.proc, emu.controller.ofp_port, emu.controller.telemetry_file, emu.controller.losses
        emu.controller.set_ecn_policy("dynamic"); emu.controller.set_routing_weights("ecmp")
        # the builder (emu.builder, hpnlab.fabric.emulation.builder): what the fabric is
        emu.builder.fabric_interfaces(); emu.builder.ingress_drops(); emu.builder.port_type
        emu.ecn                      # EcnStage: .set_thresholds(...), .counters(...) (see .ecn)
        emu.switch_ports()           # every switch egress port with its emulated rate
        emu.connected_switches()     # bridge -> connected to the controller (from ovsdb)
        emu.metadata                 # mechanisms used and what could not be emulated here
        emu.timings                  # seconds to controller ready, built, connected, up

    # EmulationOptions(failover=FailoverOptions(bfd_ms=50)): BFD on every fabric port (a failed session:
    #   port not live); 0 and a scenario ``bfd`` block: the scenario's intervals
    # PortOptions(ovs_sched="off"): leave ovs-vswitchd's scheduling alone (default "nice": its main thread
    #   runs at nice -20 for the run, it forwards every packet on the userspace datapath; "rr": SCHED_RR as
    #   earlier releases did, which real-time throttling stalls under traffic)
    # EmulationOptions(rewire=Rewire(swap=[...], drop=[...], dpid_base=..., port_offset=...)): cabled
    #   differently from the scenario, or on foreign dpids/ofports (emulation/rewire.py); the controller's
    #   wiring report is emu.metadata["wiring"], a staged rollout's emu.metadata["rollout"]
    # Emulation(scenario, options, on_built=fn): fn(emu) once the network exists, before the switches are
    #   installed; Emulation(..., log=None): no lines on stderr
    # ControllerOptions(on_loss="restart"|"stop"|"continue"): a dead controller is noticed (pid polled),
    #   said in one line, and restarted, the run stopped (ControllerLost), or neither

What ``start()`` (``__enter__``) does, in order:

1. preflight, each failure one line (``UserError``): root, OVS installed and running,
   Mininet present, htb present, the controller known and installed, the OpenFlow port free
   when one was asked for, the scenario small enough for this machine (hosts + switches
   per core, packets/s budget of userspace OVS), the hosts' TCP congestion control
   (``emulation.tcp_congestion``) available and allowed in their namespaces;
2. takes the machine-wide lock (``/run/hpnlab/lock``; a run in progress holds it, so a second
   waits), checks that no bridge or interface name is taken (under the lock: what it finds is
   left over, not a live run's), and writes the run's state file
   (``/run/hpnlab/runs/<id>.json``); every bridge, veth, process and BPF pin is recorded
   there *before* it is created, bridges are marked ``external_ids:hpnlab-run=<id>`` and
   children inherit ``HPNLAB_RUN=<id>``, so ``hpnlab clean`` removes exactly them after a
   SIGKILL. SIGINT/SIGTERM/SIGHUP unwind through ``stop()``;
3. starts the controller (``python -m hpnlab.controller SCEN --ofp-port N --listen 127.0.0.1``)
   in its own process group and waits for its ``ready`` line;
4. builds the network through the Mininet Python API: ``OVSSwitch`` with the kernel
   datapath when the openvswitch module is loaded, else ``datapath='user'``; fail mode
   secure (standalone with ``controller="none"``), OpenFlow13, the graph's dpids and port
   numbers; hosts with one interface per NIC port, plane-prefix addresses, per-source policy
   routing when several ports share a plane, ``ethtool -K tx off`` (unless OVS has
   userspace TSO on), IPv6 off, ``tcp_ecn=1``;
5. shapes every sending interface with htb to the emulated rate (``hpnlab.fabric.emulation.mn.emulated_mbps``)
   and a port buffer; netem delay only where the kernel has netem, otherwise one line and
   ``metadata["not_emulated"]``;
6. puts the ECN marking stage on every switch egress port (``hpnlab.fabric.emulation.ecn``);
7. waits (``ControllerOptions.connect_timeout_s``) until ovsdb reports every bridge connected,
   then pings every host-port pair on every plane and refuses to hand over if any pair fails;
   with ``SupervisionOptions(verify_branches=True)`` it also walks every entropy branch of
   every pair with UDP probes.

One concern per module (after Mininet's node.py/link.py/net.py): ``harness`` (``Emulation``:
the order of things), ``options`` (what a run is asked to do), ``builder`` (hosts, switches, links,
shaping, BFD, the ECN stage), ``supervisor`` (the controller process), ``faults`` (the fault API),
``preflight``, ``controller_process``, ``nodes`` (node classes and
interface configuration), ``ovsdb`` (every ovs-vsctl call), ``reachability`` (pure scripts and
parsers) and ``walks`` (running them), ``faults``, ``failover`` (the loss-window probe),
``shaping``, ``ecn``, ``state``, ``signals``, ``timeline``, ``udp``, ``traffic``;
the size estimate is ``hpnlab.fabric.emulation.sizing``.

Multi-machine (Mininet's cluster edition, ``mininet.examples.cluster.MininetCluster``)::

    Emulation(spec.load("small-hpn"), EmulationOptions(
        cluster=ClusterOptions(servers=("localhost", "node2"), placement="plane"),
        controller=ControllerOptions(listen="192.0.2.10")))
    sudo hpnlab emulate small-hpn --servers localhost,node2 --placement plane --controller-ip 192.0.2.10

Every server needs Mininet, Open vSwitch and this repository, and root on this machine must
reach ``root@server`` by ssh without a password (MininetCluster checks with ``ssh server
sudo true``). ``placement="plane"`` puts each plane's switches on one server (planes share
no link, so only host links cross machines, as SSH-tunnelled ``RemoteLink`` s); Mininet's
``switch-bin``, ``round-robin`` and ``random`` placers are also accepted. The controller
must listen on an address the servers reach (``ControllerOptions.listen``). Tested here with
``localhost`` as the only server (tests/emulation/test_cluster.py); with remote servers,
shaping and the ECN stage are applied to local switch ports only, and ``hpnlab clean`` must
run on each server after a crash (both are written into ``metadata["not_emulated"]``).
Never run Mininet's machine-wide cleanup on a server (MininetCluster's own cleanup does it over ssh).

``stop()`` (``__exit__``) removes everything through the same code as ``hpnlab clean``
(``cleanup.teardown``) and never uses Mininet's machine-wide cleanup.
"""
from __future__ import annotations

from typing import Any

__all__ = ["CONTROLLERS", "ControllerLost", "Emulation", "EmulationError", "EmulationOptions", "Lock", "RunState",
           "clean"]

# Loaded on first use (PEP 562), so that a light module of this package (``ovsdb``, ``reachability``,
# ``shaping``) never pulls the harness in: ``hpnlab doctor`` and the kernel probe stay light.
_WHERE = {"CONTROLLERS": ".options", "EmulationOptions": ".options", "Emulation": ".harness",
          "EmulationError": ".errors", "ControllerLost": ".errors",
          "Lock": ".state", "RunState": ".state", "clean": ".state"}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module
    return getattr(import_module(_WHERE[name], __name__), name)


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
