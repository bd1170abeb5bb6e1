"""Two dynamic-ECN policies in one file, as a user writes them (``--ecn-policy FILE.py:CLASS``).

They are extremes, used by the emulated test and ``tools/bench/bench_ecn_control.py`` to show that
thresholds the controller applies live change the marking on a real port: *eager* marks as soon
as a packet finds any queue, *quiet* never marks. The interface is
``hpnlab.controller.ecn_policy.EcnPolicy``: ``decide(now, ports, current)`` returns the
thresholds it wants per port (only differences are sent).
"""
from hpnlab.controller.ecn_policy import EcnPolicy, Thresholds


class Eager(EcnPolicy):
    name = "eager"

    def decide(self, now, ports, current):
        return {k: Thresholds(0, 3028, 0.1, reason="example: mark on any queue") for k in current}


class Quiet(EcnPolicy):
    name = "quiet"

    def decide(self, now, ports, current):
        return {k: Thresholds(1 << 30, 1 << 30, 0.1, reason="example: never mark") for k in current}
