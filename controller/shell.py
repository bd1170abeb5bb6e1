"""What the os-ken app's collaborators see of it (the shell): the fabric it runs on, the switches connected,
the reconciler, and ``handle`` (an event to the reconciler, its answer encoded and sent).

The app (controller/app.py) decodes, dispatches and encodes; each concern around it is a collaborator
class in a module of its own that wraps a pure decider, as Faucet's ``valve_*`` managers do:

=========================  =====================================  ======================================
collaborator               module                                 decides (pure)
=========================  =====================================  ======================================
``WiringManager``          ``wiring_manager.py``                  ``wiring.py``: LLDP against the graph,
                                                                  what may be installed
``AdoptionManager``        ``adoption_manager.py``                ``deployment.py``: real dpids and ports,
                                                                  port names, ``--deployment auto``
``RolloutManager``         ``rollout_manager.py``                 ``rollout.py``: one plane at a time
``TelemetryManager``       ``telemetry_manager.py``               ``ecn_loop.py``/``ecn_policy.py``,
                                                                  ``fabric/routing/weights.py``
``ArpManager``             ``arp_manager.py``                     ``compiler.arp_answer``, ``arp_fallback.py``
``DryRunManager``          ``dryrun_manager.py``                  ``dryrun.py``
=========================  =====================================  ======================================

A collaborator reaches the others through the app (``app.wiring``, ``app.adoption``...), never by
importing them: the modules import only the deciders, ``codec`` (OpenFlow messages and frames) and this
protocol. The app's state that several of them read (``graph``, ``index``, ``reconciler``, ``datapaths``)
stays on the app; whoever changes it (adoption: a new graph) does so through the app (``rebase``).
"""
from __future__ import annotations

from typing import Any, Protocol

import networkx as nx

from hpnlab.fabric.routing import compiler
from hpnlab.fabric.scenario import spec

from . import reconcile


class Shell(Protocol):
    """The os-ken app as its collaborators use it."""
    scenario: spec.Scenario
    graph: nx.MultiGraph               # the scenario's graph on the deployment's dpids and ports
    index: compiler.FabricIndex
    reconciler: reconcile.Reconciler
    datapaths: dict[str, Any]          # switch name -> connected os-ken Datapath
    metrics: Any                       # metrics.Metrics, or None (prometheus_client missing)
    metrics_served: bool               # served on a port (someone may scrape them)
    dry_run: bool
    started: float                     # time.monotonic() at start
    # the collaborators (typed where they are defined; a module imports none of the others)
    wiring: Any
    adoption: Any
    rollout: Any
    telemetry: Any
    arp: Any

    def handle(self, event: reconcile.Event) -> None: ...

    def rebase(self, g: nx.MultiGraph) -> None: ...
