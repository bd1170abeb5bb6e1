"""Per-packet and flowlet routing on the emulated mini-hpn (real OVS, the controller, shaped
links, the ECN stage): spray, flowlet, adaptive and reps entropy each deliver every byte of an
all-to-all exactly once (bytes and CRC-32 at both ends of every flow,
``hpnlab.fabric.transport.accounting``) with the data verified at every rank, on source
ports bound to the controller's entropy map. How fast each goes is for
``hpnlab run --compare routing``, not a test."""
from __future__ import annotations

import pytest

from hpnlab.fabric.experiments import runner as experiment
from hpnlab.fabric.experiments.runner import Plan
from hpnlab.fabric.routing.compiler import entropy_map
from hpnlab.fabric.routing.entropy import EntropyMap
from hpnlab.fabric.transport.accounting import exactly_once

pytestmark = [pytest.mark.emulation, pytest.mark.controller]


def test_spray_flowlet_adaptive_and_reps_deliver_every_byte_exactly_once(mini_hpn):
    plan = Plan(collectives="all_to_all", transports="roce", entropies="spray,flowlet,adaptive,reps", ranks=4,
                placement="cross-rail", sizes="128K", iterations=1, warmup=0, inplace=False)
    results = experiment.run(plan, mini_hpn, progress=False)["results"]
    emap = entropy_map(mini_hpn.graph)
    assert [r["entropy"] for r in results] == ["spray", "flowlet", "adaptive", "reps"]
    for res in results:
        assert res["rows"][0]["oop"]["wrong"] == 0
        flows = [f for f in res["flows"] if f.get("app_bytes_sent")]
        assert len(flows) == 4 * 3                                  # every ordered rank pair carried data
        assert all(exactly_once(f) for f in flows), res["entropy"]
        info = res["transport_info"]
        assert EntropyMap.from_dict(info["entropy_map"]) == emap
        assert [p & (1 << emap.width) - 1 for p in info["source_ports"]] == \
            [emap.low_bits(k) for k in info["entropy_values"]]
