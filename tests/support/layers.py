"""The architecture's layer table (docs/architecture.md): which package may import which. Held to the code by
tests/unit/test_layers.py and to the architecture page's diagram by tests/unit/test_docs.py."""
from __future__ import annotations

#: the layers, bottom to top; a package imports only its own layer's allowed neighbours and below
LAYERS: dict[str, int] = {
    "hpnlab.fabric.base": 0,          # errors, tail, stats: the modules directly under fabric/
    "hpnlab.fabric.scenario": 1,
    "hpnlab.fabric.routing": 2,
    "hpnlab.fabric.workload": 3,
    "hpnlab.controller": 4,
    "hpnlab.fabric.model": 4,
    "hpnlab.fabric.transport": 4,
    "hpnlab.fabric.emulation": 4,
    "hpnlab.fabric.switches": 4,       # simulated OpenFlow switches (never imported by the controller)
    "hpnlab.fabric.experiments": 5,
    "hpnlab.fabric.checks": 5,
    "hpnlab.fabric.web": 6,
    "hpnlab.cli": 6,
    "hpnlab.topologies": 6,
}
#: engines of one layer that may use one another (the emulation runs transports' ranks and names
#: TCP settings; nothing else crosses: the controller and the model never import each other, and
#: the controller never imports the emulation)
SIDEWAYS = {("hpnlab.fabric.emulation", "hpnlab.fabric.transport"),
            ("hpnlab.cli", "hpnlab.fabric.web")}
