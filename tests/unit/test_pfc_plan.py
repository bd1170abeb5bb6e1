"""Priority flow control's plan (fabric/emulation/pfc_plan.py): ids, tags, the maps' layouts held to
the C source, the agent's configuration, its reaction percentiles."""
from __future__ import annotations

import re
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpnlab.fabric.emulation import nodes, pfc_plan, shaping
from hpnlab.fabric.emulation.pfc import BPF_SOURCE, plan_from_dict
from hpnlab.fabric.errors import UserError
from hpnlab.fabric.scenario import graph as fgraph
from hpnlab.fabric.scenario import spec

MARKER = BPF_SOURCE.parent / "ecn_marker.bpf.c"
C_SIZES = {"__u8": 1, "__u16": 2, "__u32": 4, "__u64": 8, "__s64": 8, "struct bpf_spin_lock": 4}


def _pfc_graph(name: str = "mini-hpn", **lossless):
    return fgraph.build(spec.load(name, {"emulation": {"lossless": {"pfc": True, **lossless}}}))


def _c_struct(source: str, name: str) -> str:
    m = re.search(r"struct " + name + r" \{(.*?)\n\};", source, re.S)
    assert m, f"struct {name} not found"
    return m.group(1)


def _c_offsets(body: str) -> tuple[list[int], int]:
    """Offsets of each (expanded) scalar field and the size, with C's natural alignment."""
    offsets, off, align = [], 0, 1
    for line in body.splitlines():
        line = re.sub(r"/\*.*?\*/", "", line).strip()
        if not line:
            continue
        m = re.match(r"(struct bpf_spin_lock|__[us]\d+)\s+(.+);", line)
        assert m, line
        size = C_SIZES[m.group(1)]
        for name in m.group(2).split(","):
            n = re.search(r"\[(\w+)\]", name)
            count = int(n.group(1)) if n and n.group(1).isdigit() else {"PFC_CLASSES": 3}.get(n.group(1), 0) if n else 1
            off = (off + size - 1) // size * size
            align = max(align, size)
            for _ in range(count):
                offsets.append(off)
                off += size
    return offsets, (off + align - 1) // align * align


def _py_offsets(s: struct.Struct) -> tuple[list[int], int]:
    offsets, off = [], 0
    for count, code in re.findall(r"(\d*)([a-zA-Z])", s.format.lstrip("<")):
        for _ in range(int(count or 1)):
            offsets.append(off)
            off += struct.calcsize("<" + code)
    return offsets, off


@pytest.mark.parametrize("name", sorted(pfc_plan.LAYOUTS))
def test_every_map_value_is_laid_out_as_the_c_structure(name):
    c = _c_offsets(_c_struct(BPF_SOURCE.read_text(), name))
    assert _py_offsets(pfc_plan.LAYOUTS[name]) == c


@pytest.mark.parametrize("name", ["ecn_cfg", "ecn_state"])
def test_the_data_path_shares_the_ecn_stages_map_layout(name):
    strip = lambda body: [re.sub(r"/\*.*?\*/", "", x).strip() for x in body.splitlines() if x.strip()]  # noqa: E731
    assert [x for x in strip(_c_struct(BPF_SOURCE.read_text(), name)) if x] == \
        [x for x in strip(_c_struct(MARKER.read_text(), name)) if x]


# ---- tags ---------------------------------------------------------------------------------------

@given(st.integers(1, 3), st.integers(0, 3), st.integers(0, 3), st.data())
def test_a_tag_gives_back_what_was_written(kbits, eg, inc, data):
    local = data.draw(st.integers(0, (1 << kbits) - 1))
    eid = data.draw(st.integers(0, (1 << (16 - 4 - kbits)) - 1))
    value = pfc_plan.tag(eid, eg, inc, local, kbits)
    assert 0 <= value < 1 << 16 and pfc_plan.untag(value, kbits) == (eid, eg, inc, local)


def test_a_tag_refuses_an_egress_id_it_cannot_hold():
    with pytest.raises(ValueError):
        pfc_plan.tag(1 << 10, 0, 0, 0, 3)


# ---- ids -----------------------------------------------------------------------------------------

def test_every_switch_port_and_nic_has_its_own_id_and_a_peer_that_points_back():
    plan = pfc_plan.build(_pfc_graph())
    by = plan.by_gid()
    assert len(by) == len(plan.ports) == 64 + 32
    for p in plan.ports:
        assert by[p.peer].peer == p.gid and by[p.peer].node != p.node


def test_a_switch_ports_id_is_its_switchs_base_plus_its_port_number():
    plan = pfc_plan.build(_pfc_graph())
    for p in plan.switch_ports():
        assert p.gid == p.base + p.port and p.port < 1 << plan.kbits


def test_host_nics_carry_their_mac_and_no_switch():
    plan = pfc_plan.build(_pfc_graph())
    assert all(p.mac and p.switch == 0 for p in plan.host_nics())


def test_a_fabric_whose_ids_the_tag_cannot_hold_is_refused_in_one_line():
    with pytest.raises(UserError, match="16-bit IPv4 ID"):
        pfc_plan.build(_pfc_graph("small-hpn"))


def test_every_switch_ingress_port_pauses_the_transmitter_at_the_other_end_of_its_link():
    plan = pfc_plan.build(_pfc_graph())
    text = pfc_plan.agent_config(plan, "/ev", "/st", lambda n: "-" if n.startswith("p") else f"/ns/{n}", 200, 100,
                                 "/nic")
    targets = [line.split() for line in text.splitlines() if line.startswith("target")]
    assert len(targets) == len(plan.switch_ports())
    by = plan.by_gid()
    for _, gid, ns, intf, *nic in targets:
        up = by[by[int(gid)].peer]
        assert up.intf == intf and (ns == "-") == up.is_switch
        assert nic == ([] if up.is_switch else [str(up.gid)])      # a host NIC's pause state is published
    assert "watchdog 200 100" in text and f"closed 1 {1500 + 14}" in text and "nicmap /nic" in text


def test_the_transport_finds_its_ports_pause_state_by_address():
    plan = pfc_plan.build(_pfc_graph())
    opt = pfc_plan.nic_pause_option(plan, "/pin/nic")
    assert opt["map"] == "/pin/nic" and len(opt["index"]) == len(plan.host_nics())
    assert all(opt["index"][p.ip] == p.gid for p in plan.host_nics())


def test_the_agent_gets_one_gate_per_lossless_priority():
    for prios in (1, 2):
        text = pfc_plan.agent_config(pfc_plan.build(_pfc_graph(), prios), "/e", "/s", lambda n: "-", 0, 1)
        gates = [line.split() for line in text.splitlines() if line.startswith("gate")]
        assert [int(g[3], 16) >> 16 for g in gates] == list(shaping.PFC_GATES[:prios])


def test_a_plan_read_back_from_its_record_is_the_same_plan():
    plan = pfc_plan.build(_pfc_graph())
    assert plan_from_dict(plan.as_dict()) == plan


def test_the_bounce_priority_setting_decides_the_lossless_priorities():
    never = lambda g: pytest.fail("the proof must not run")  # noqa: E731
    assert pfc_plan.lossless_priorities(_pfc_graph(bounce_priority="on"), never) == 2
    assert pfc_plan.lossless_priorities(_pfc_graph(bounce_priority="off"), never) == 1
    assert pfc_plan.lossless_priorities(_pfc_graph(), lambda g: True) == 2
    assert pfc_plan.lossless_priorities(_pfc_graph(), lambda g: False) == 1


def test_with_pfc_a_switch_port_may_hold_its_switchs_whole_buffer():
    ports = nodes.switch_ports(_pfc_graph())
    buffers = pfc_plan.switch_buffers(_pfc_graph(), 2)
    assert all(p["pfc"] and p["lossless_bytes"] == buffers[p["switch"]].total_bytes for p in ports)
    shape = shaping.port_shape(ports[0], 1500)
    assert shape.max_queued_bytes == shape.queue_bytes + ports[0]["lossless_bytes"]


def test_the_gated_tree_has_a_gate_per_lossless_class_and_the_lossy_class_by_default():
    lines = shaping.tc_lines(shaping.Shape("x", 10.0, pfc=True), netem=False)
    assert lines[0].endswith(f"default {shaping.PFC_LOSSY_CLASS:x} r2q 1")
    for gate in shaping.PFC_GATES:
        assert sum(f"handle {gate:x}: tbf" in line for line in lines) == 1
    assert any(f"classid 1:{shaping.PFC_HIGH_CLASS:x} " in line and line.endswith("prio 0") for line in lines)


# ---- reading the agent's figures ---------------------------------------------------------------

def test_reaction_percentiles_are_the_upper_bound_of_the_bucket_they_fall_in():
    hist = [[10, 50], [20, 49], [900, 1]]
    pct = pfc_plan.reaction_percentiles(hist, (50, 99, 100))
    assert pct == {50: 10.0, 99: 20.0, 100: 900.0}


def test_reaction_percentiles_of_nothing_are_none():
    assert pfc_plan.reaction_percentiles([], (50,)) == {50: None}


def test_a_reaction_beyond_a_second_counts_as_the_longest():
    assert pfc_plan.reaction_percentiles([[5, 1], [0, 1]], (100,)) == {100: 1e9}


def test_a_measurement_counts_only_what_happened_between_its_two_readings():
    before: dict[str, dict] = {
        "p0l0-eth5": {"switch_port": True, "pauses_sent": 10, "paused_s": 1.0, "headroom_drops": 0, "lossy_drops": 2},
        "h1-eth0": {"switch_port": False}}
    after: dict[str, dict] = {
        "p0l0-eth5": {"switch_port": True, "pauses_sent": 14, "paused_s": 1.5, "headroom_drops": 1, "lossy_drops": 2,
                      "headroom_peak": 3000, "ingress_peak": 40000},
        "h1-eth0": {"switch_port": False, "pauses_received": 99}}
    switches = {"p0l0": {"shared_peak": 50_000, "shared_bytes": 200_000}}
    out = pfc_plan.summarize(before, after, switches, seconds=2.0)
    assert (out["pauses"], out["paused_s"], out["headroom_drops"], out["lossy_drops"]) == (4, 0.5, 1, 0)
    assert out["ports_paused"] == 1 and out["paused_share_max"] == 0.25 and out["shared_peak_share"] == 0.25
    assert out["per_port"]["p0l0-eth5"]["pauses"] == 4 and "h1-eth0" not in out["per_port"]


def test_the_agent_reads_the_ingress_queue_where_the_data_path_writes_it():
    import re as _re
    agent = (BPF_SOURCE.parent / "pfc_agent.c").read_text()
    consts = {k: int(v) for k, v in _re.findall(r"#define INGRESS_(\w+) (\d+)", agent)}
    offsets, size = _py_offsets(pfc_plan.INGRESS)
    assert consts == {"SIZE": size, "PAUSED": offsets[1], "SEQ": offsets[12]}
