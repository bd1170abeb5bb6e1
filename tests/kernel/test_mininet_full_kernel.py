"""Mininet on the full kernel, without the project's harness: the mechanisms the harness
relies on where the kernel has them — OVS kernel datapath, netem delay, RED with ECN
(Mininet's own TCLink bw/delay/enable_ecn) — work and behave as configured.

One emulated network for the module:

    h1, h3 -- s1 ==(4 Mbit/s, RED+ECN)== s2 ==(5 ms each way, netem)== h2

The bottleneck and the delay are on different links so that RED's queue holds only
packets waiting for the link, not netem's delay line.
"""
from __future__ import annotations

import json
import re
import time

import pytest

pytestmark = [pytest.mark.kernel, pytest.mark.emulation]

BOTTLENECK_MBPS = 4
ONE_WAY_DELAY_MS = 5
# Mininet's RED settings for enable_ecn (bytes), and the lower ones set live.
DEFAULT_RED_MIN, DEFAULT_RED_MAX = 30000, 35000
LOW_RED_MIN, LOW_RED_MAX = 3000, 6000


@pytest.fixture(scope="module")
def net():
    from mininet.link import Link, TCLink
    from mininet.net import Mininet
    from mininet.node import OVSSwitch
    from mininet.topo import Topo

    class Dumbbell(Topo):
        def build(self):
            s1 = self.addSwitch("s1", failMode="standalone")
            s2 = self.addSwitch("s2", failMode="standalone")
            for h in ("h1", "h3"):
                self.addLink(self.addHost(h), s1, cls=Link)
            self.addLink(s1, s2, cls=TCLink, bw=BOTTLENECK_MBPS, enable_ecn=True)
            self.addLink(s2, self.addHost("h2"), cls=TCLink, delay=f"{ONE_WAY_DELAY_MS}ms")

    # OVSSwitch with no datapath argument = the kernel datapath.
    net = Mininet(topo=Dumbbell(), switch=OVSSwitch, controller=None,
                  autoSetMacs=True, waitConnected=False)
    try:
        net.start()
        for h in net.hosts:
            h.cmd("sysctl -qw net.ipv4.tcp_ecn=1")
        yield net
    finally:
        net.stop()


def bottleneck_intf(net) -> str:
    """s1's interface toward s2: the egress queue of traffic from h1 to h2."""
    link = net.linksBetween(net["s1"], net["s2"])[0]
    return link.intf1.name if link.intf1.node.name == "s1" else link.intf2.name


def ping_rtts_ms(src, dst, count=10) -> list[float]:
    out = src.cmd(f"ping -n -c {count} -i 0.2 -W 2 {dst.IP()}")
    return [float(x) for x in re.findall(r"time=([\d.]+) ms", out)]


def red_stats(sw, intf: str) -> dict:
    out = sw.cmd(f"tc -s qdisc show dev {intf}")
    m = re.search(r"qdisc red 6:.*?backlog (\d+)b.*?marked (\d+) early (\d+) pdrop (\d+)", out, re.S)
    assert m, f"no RED qdisc on {intf}:\n{out}"
    params = re.search(r"qdisc red 6:.*?min (\S+) max (\S+)(.*)", out)
    assert params, f"no RED parameters on {intf}:\n{out}"
    return {"backlog": int(m.group(1)), "marked": int(m.group(2)), "early": int(m.group(3)),
            "pdrop": int(m.group(4)), "min": params.group(1), "max": params.group(2),
            "ecn": " ecn" in params.group(3), "text": out}


class TcpLoad:
    """iperf3 TCP from h1 to h2 (`flows` parallel connections) for `seconds`."""

    def __init__(self, net, seconds: int, flows: int = 1):
        self.h1, self.h2, self.seconds, self.flows = net["h1"], net["h2"], seconds, flows

    def __enter__(self):
        self.server = self.h2.popen(["iperf3", "-s", "-1"])
        time.sleep(1.0)
        self.client = self.h1.popen(["iperf3", "-c", self.h2.IP(), "-t", str(self.seconds),
                                     "-P", str(self.flows), "-J"])
        return self

    def wait(self) -> dict:
        out, _ = self.client.communicate(timeout=self.seconds + 60)
        return json.loads(out)

    def __exit__(self, *exc):
        for p in (self.client, self.server):
            if p.poll() is None:
                p.terminate()
                p.wait(timeout=10)


def test_switches_use_the_kernel_datapath_and_forward(net):
    s1 = net["s1"]
    assert s1.cmd("ovs-vsctl get bridge s1 datapath_type").strip() in ('""', "system")
    assert "system@ovs-system" in s1.cmd("ovs-dpctl show")
    assert net.ping([net["h1"], net["h2"], net["h3"]], timeout=5) == 0.0
    # The pings went through flows the kernel datapath installed and counted.
    flows = s1.cmd("ovs-dpctl dump-flows system@ovs-system")
    packets = [int(n) for n in re.findall(r"packets:(\d+)", flows)]
    assert packets and sum(packets) > 0, flows


def test_netem_delay_adds_the_configured_round_trip(net):
    h1, h2, h3 = net["h1"], net["h2"], net["h3"]
    across = ping_rtts_ms(h1, h2)      # crosses the delayed link twice
    local = ping_rtts_ms(h1, h3)       # same switch, no delay: the emulation's own cost
    assert len(across) >= 8 and len(local) >= 8
    added = min(across) - min(local)
    print(f"RTT h1-h2 min {min(across):.2f} ms, h1-h3 min {min(local):.2f} ms "
          f"(TCG/OVS offset), netem adds {added:.2f} ms for {2 * ONE_WAY_DELAY_MS} ms configured")
    assert 2 * ONE_WAY_DELAY_MS * 0.95 <= added <= 2 * ONE_WAY_DELAY_MS + 4


def test_red_marks_ecn_capable_tcp_instead_of_dropping(net):
    """Eight ECN-capable TCP flows share the bottleneck: RED marks them.

    (Eight, because one TCP flow keeps only about two GSO packets, ~6 KB, in the switch's
    queue on this kernel (measured; TCP Small Queues counting the switch's queue as the
    sender's is the likely cause), below Mininet's 30 KB RED minimum.)"""
    s1, intf = net["s1"], bottleneck_intf(net)
    before = red_stats(s1, intf)
    assert before["ecn"], before["text"]
    with TcpLoad(net, seconds=5, flows=8) as load:
        result = load.wait()
    after = red_stats(s1, intf)
    mbps = result["end"]["sum_received"]["bits_per_second"] / 1e6
    marked, early = after["marked"] - before["marked"], after["early"] - before["early"]
    print(f"8 TCP flows: {mbps:.2f} Mbit/s through a {BOTTLENECK_MBPS} Mbit/s link; "
          f"RED marked {marked}, dropped early {early}")
    assert marked > 0
    assert marked > early
    assert mbps <= 1.05 * BOTTLENECK_MBPS          # htb holds the link to its rate
    # (the share of the link the flows reach is the emulating machine's speed: printed above, not asserted)


def test_lowering_red_thresholds_live_marks_what_was_below_them(net):
    """`tc qdisc change` on the running RED: the new thresholds apply at once (same qdisc,
    its counters kept) and one TCP flow, whose standing queue sits below Mininet's
    30 KB minimum, gets marked once the minimum is 3 KB."""
    s1, intf = net["s1"], bottleneck_intf(net)

    def marks_for_one_flow() -> int:
        before = red_stats(s1, intf)["marked"]
        with TcpLoad(net, seconds=5, flows=1) as load:
            load.wait()
        return red_stats(s1, intf)["marked"] - before

    at_default = marks_for_one_flow()
    marked_before = red_stats(s1, intf)["marked"]
    out = s1.cmd(f"tc qdisc change dev {intf} parent 5:1 handle 6: red limit 1000000 "
                 f"min {LOW_RED_MIN} max {LOW_RED_MAX} avpkt 1500 burst 3 "
                 f"bandwidth {BOTTLENECK_MBPS}mbit probability 1 ecn")
    assert out.strip() == "", out
    changed = red_stats(s1, intf)
    assert changed["marked"] >= marked_before          # same qdisc: counters not reset
    assert (changed["min"], changed["max"]) in {("3000b", "6000b"), ("3Kb", "6Kb")}, changed["text"]
    at_low = marks_for_one_flow()
    print(f"one TCP flow: RED marked {at_default} with min/max {DEFAULT_RED_MIN}/{DEFAULT_RED_MAX} B, "
          f"{at_low} with {LOW_RED_MIN}/{LOW_RED_MAX} B")
    assert at_low > 0
    assert at_low > 2 * at_default
