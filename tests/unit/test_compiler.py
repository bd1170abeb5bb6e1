"""The routing compiler's output, role by role, and its route counts against the formulas."""
from __future__ import annotations

from typing import Any

import pytest
from support.fabrics import fabric

from hpnlab.fabric.errors import UserError
from hpnlab.fabric.routing import compiler
from hpnlab.fabric.scenario import analysis, graph


def routes(state):
    """{prefix text: actions} of a switch's table 1 (compact blocks listed as 'leaf-prefix*')."""
    out = {}
    for f in state.flows:
        if f.table != compiler.TABLE_ROUTE:
            continue
        (net_mask,) = [v for k, v in f.match if k == "ipv4_dst"]
        if isinstance(net_mask, tuple):
            net, mask = net_mask
            text = f"{compiler.ip_str(net)}/{bin(mask).count('1')}"
        else:
            text = f"{compiler.ip_str(net_mask)}/32"
        out[text + ("*" if f.hosts is not None else "")] = f.actions
    return out


def uplink_ports(g, sw):
    return tuple(sorted(p for p, _, _ in compiler.index_of(g).sw[sw].up))


def buckets(state, actions) -> tuple:
    """The watch ports of the fast-failover group a route's actions send to."""
    ((kind, gid),) = actions
    assert kind == "group"
    (group,) = [gr for gr in state.groups if gr.group_id == gid]
    assert group.kind == "ff"
    return tuple(port for port, _ in group.buckets)


def avoided(state, actions) -> tuple[tuple, int]:
    """(next-hop set, port left out) of a route that writes "set minus one port" metadata."""
    meta = actions[0][1]
    assert actions[1] == ("goto", compiler.TABLE_ENTROPY) and meta >> 32
    low, index = meta & compiler.FULL, (meta >> 32) - 1
    ports = {a[1] for f in state.flows if f.table == compiler.TABLE_ENTROPY
             and dict(f.match)["metadata"] == (low, compiler.FULL) for a in f.actions}
    groups = {gr.group_id: gr.buckets[0][0] for gr in state.groups}
    full = tuple(sorted(groups[gid] for gid in ports))
    return full, full[index]


# ---- per role ----------------------------------------------------------------------

def test_leaf_routes_its_hosts_drops_the_rest_of_its_prefix_and_sends_the_plane_up():
    g = fabric("mini-hpn")
    leaf = compiler.compile_fabric(g)["p0l1"]
    r = routes(leaf)
    plan = g.graph["plan"]
    hosts = {p["ip"]: p for h in graph.hosts(g) for p in graph.host_ports(g, h) if p["leaf"] == "p0l1"}
    assert {k: v for k, v in r.items() if k.endswith("/32")} == {   # from the gateway to the host's own MAC
        f"{ip}/32": (("set_field", "eth_src", compiler.GATEWAY_MAC), ("set_field", "eth_dst", p["mac"]),
                     ("output", p["leaf_port"])) for ip, p in hosts.items()}
    assert r[g.nodes["p0l1"]["prefix"]] == ()                               # the rest of its prefix: drop
    up = r[plan.plane_prefix(0)]
    assert up[0][0] == "metadata" and up[1] == ("goto", compiler.TABLE_ENTROPY)    # multipath over both uplinks
    assert len(r) == len(hosts) + 2


def test_leaf_sends_arp_to_the_controller_and_ipv4_to_routing_and_nothing_else():
    g = fabric("mini-hpn")
    t0 = [f for f in compiler.compile_fabric(g)["p0l0"].flows if f.table == compiler.TABLE_CLASSIFY
          and "in_port" not in dict(f.match) and "eth_src" not in dict(f.match)]
    own = [f for f in t0 if "ipv4_dst" in dict(f.match)]
    assert {(dict(f.match)["eth_type"], f.actions) for f in t0} == {
        (compiler.ETH_ARP, (("controller",),)), (compiler.ETH_IPV4, (("goto", compiler.TABLE_ROUTE),))}
    assert len(own) == 1      # its own prefix, whichever port it comes from, is routed as usual


def test_leaf_bounces_what_a_spine_sends_it_for_someone_else_up_another_spine_marked():
    """The detour of a spine that lost its link to a leaf: the leaf it detours through sends
    the packet up avoiding that spine (set minus the spine's port), marked as bounced."""
    g = fabric("mini-hpn")
    st = compiler.compile_fabric(g)["p0l0"]
    bounce = {dict(f.match)["in_port"]: f.actions for f in st.flows
              if f.table == compiler.TABLE_CLASSIFY and "in_port" in dict(f.match)
              and dict(f.match)["eth_type"] == compiler.ETH_IPV4}
    assert set(bounce) == set(uplink_ports(g, "p0l0"))
    for port, actions in bounce.items():
        assert actions[0] == ("set_field", "eth_src", compiler.BOUNCE_MAC)
        assert avoided(st, actions[1:]) == (uplink_ports(g, "p0l0"), port)
    marked = [f for f in st.flows if dict(f.match).get("eth_src") == compiler.BOUNCE_MAC]
    assert [f.actions for f in marked] == [()]      # a bounced packet is never bounced again


def test_spines_never_send_arp_to_the_controller_and_send_bounced_packets_to_the_bounced_table():
    g = fabric("mini-hpn")
    t0 = [f for f in compiler.compile_fabric(g)["p0s0"].flows if f.table == compiler.TABLE_CLASSIFY]
    assert {dict(f.match)["eth_type"] for f in t0} == {compiler.ETH_IPV4}
    assert {f.actions for f in t0 if dict(f.match).get("eth_src") == compiler.BOUNCE_MAC} == {
        (("goto", compiler.TABLE_BOUNCED),)}


def test_two_tier_spine_holds_one_route_per_leaf_of_its_plane_and_no_default():
    """Each route is a fast-failover group: the leaf's port first, then detours through other leaves,
    then back out of the port the packet came in on (a bucket watching an always-live group)."""
    g = fabric("mini-hpn")
    st = compiler.compile_fabric(g)["p1s0"]
    r = routes(st)
    leaves = [n for n in graph.switches(g) if g.nodes[n]["tier"] == 1 and g.nodes[n]["plane"] == 1]
    port = {leaf: graph.link_ports(g, "p1s0", leaf)[0][0] for leaf in leaves}
    assert set(r) == {g.nodes[leaf]["prefix"] for leaf in leaves}
    for leaf in leaves:
        ports = buckets(st, r[g.nodes[leaf]["prefix"]])
        assert ports[0] == port[leaf] and set(ports[1:-1]) == set(port.values()) - {port[leaf]}
        assert isinstance(ports[-1], tuple) and ports[-1][0] == "group"
    bounced = routes_of_table(st, compiler.TABLE_BOUNCED)
    assert bounced == {g.nodes[leaf]["prefix"]: (("output", port[leaf]),) for leaf in leaves}


def routes_of_table(state, table):
    return routes(compiler.SwitchState(state.name, state.dpid,
                                       tuple(f._replace(table=compiler.TABLE_ROUTE) for f in state.flows
                                             if f.table == table)))


def test_spine_under_a_core_drops_its_pod_beyond_its_leaves_and_sends_the_rest_up():
    g = fabric("mini-cross-campus")
    plan = g.graph["plan"]
    r = routes(compiler.compile_fabric(g)["p0s0"])
    assert r[plan.pod_prefix(0, 0, 0)] == ()
    st = compiler.compile_fabric(g)["p0s0"]
    # its one uplink, then detours down to its two leaves, then back where the packet came from
    up = buckets(st, r[plan.plane_prefix(0)])
    assert up[0] == uplink_ports(g, "p0s0")[0] and len(up) == 4 and up[3][0] == "group"
    assert len(r) == 2 + 2      # two leaves in its pod


def test_core_routes_each_pod_down_and_each_far_campus_across():
    g = fabric("mini-cross-campus")
    plan = g.graph["plan"]
    r = routes(compiler.compile_fabric(g)["p0c0"])
    lateral = compiler.index_of(g).sw["p0c0"].lateral
    assert r[plan.campus_prefix(0, 1)] == (("output", lateral[0][0]),)
    assert r[plan.pod_prefix(0, 0, 0)][1] == ("goto", compiler.TABLE_ENTROPY)     # down to both spines
    assert len(r) == 2


def test_fat_tree_core_holds_one_route_per_pod():
    g = fabric("fat-tree-4")
    plan = g.graph["plan"]
    r = routes(compiler.compile_fabric(g)["c0"])
    assert set(r) == {plan.pod_prefix(0, 0, p) for p in range(4)}


def test_host_routes_policy_has_one_route_per_host_address_and_no_aggregate():
    g = fabric("mini-hpn")
    st = compiler.compile_fabric(g, policy="host-routes")
    plane_ports = sum(1 for h in graph.hosts(g) for p in graph.host_ports(g, h) if p["plane"] == 0)
    for name in ("p0l0", "p0s1"):
        table = st[name].expanded()
        dsts = [dict(k[2])["ipv4_dst"] for k in table if k[0] == compiler.TABLE_ROUTE]
        assert all(isinstance(d, int) for d in dsts)          # only /32 routes
        assert len(dsts) == st[name].route_count == plane_ports    # own hosts included on the leaf


def test_unknown_policy_is_a_user_error():
    with pytest.raises(UserError, match="routing policy"):
        compiler.compile_fabric(fabric("mini-hpn"), policy="ecmp-magic")


def test_compiling_twice_gives_identical_state():
    g = fabric("mini-rail")
    f = compiler.Failures.of([("p0l0", "p0s0", 0)])
    assert compiler.compile_fabric(g, f) == compiler.compile_fabric(g, f)


def test_failed_switch_gets_no_state():
    g = fabric("mini-hpn")
    assert "p0s0" not in compiler.compile_fabric(g, compiler.Failures(switches=frozenset(["p0s0"])))


# ---- de-aggregation -----------------------------------------------------------------------

def test_a_failed_leaf_spine_link_adds_exactly_one_specific_route_per_other_leaf():
    g = fabric("mini-hpn")
    healthy = compiler.compile_fabric(g)
    failed = compiler.compile_fabric(g, compiler.Failures.of([("p0l0", "p0s0", 0)]))
    prefix = g.nodes["p0l0"]["prefix"]
    for leaf in ("p0l1", "p0l2", "p0l3"):
        s0_port = next(p for p, n, _ in compiler.index_of(g).sw[leaf].up if n == "p0s0")
        added = {k: v for k, v in routes(failed[leaf]).items() if routes(healthy[leaf]).get(k) != v}
        assert list(added) == [prefix]         # avoid p0s0 for p0l0's hosts only
        assert avoided(failed[leaf], added[prefix]) == (uplink_ports(g, leaf), s0_port)
    # p0l0 itself lost an uplink: its plane route now avoids it; the spine keeps its route (the
    # group detours, so packets still on their way there are not dropped)
    assert avoided(failed["p0l0"], routes(failed["p0l0"])[g.graph["plan"].plane_prefix(0)]) == \
        (uplink_ports(g, "p0l0"), uplink_ports(g, "p0l0")[0])
    assert routes(failed["p0s0"]) == routes(healthy["p0s0"])
    assert compiler.deaggregated(failed, healthy) == 3
    # the other plane is untouched
    assert all(failed[n] == healthy[n] for n in healthy if n.startswith("p1"))


def test_repair_removes_the_deaggregated_routes():
    g = fabric("fat-tree-4")
    healthy = compiler.compile_fabric(g)
    failed = compiler.compile_fabric(g, compiler.Failures.of([("e0", "a0", 0)]))
    assert compiler.deaggregated(failed, healthy) > 0
    repaired = compiler.compile_fabric(g, compiler.Failures())
    assert repaired == healthy and compiler.deaggregated(repaired, healthy) == 0


def test_unreachable_destination_gets_explicit_drop_where_the_aggregate_would_send_it_on():
    """A spine that lost its only path to a leaf must not bounce the leaf's traffic."""
    g = fabric("mini-cross-campus")
    f = compiler.Failures.of([("p0s0", "p0l0", 0), ("p0s1", "p0l0", 0)])   # p0l0 cut off from its spines
    st = compiler.compile_fabric(g, f)
    assert routes(st["p0c0"])[g.nodes["p0l0"]["prefix"]] == ()


# ---- a recompile patched from the healthy plane ---------------------------------------------

PATCH_PRESETS = ["mini-hpn", "small-hpn", "fat-tree-4", "mini-rail", "mini-cross-campus", "mini-spine-leaf"]


def single_failures(g) -> list[compiler.Failures]:
    links = [compiler.link_id(u, v, k) for u, v, k, d in g.edges(keys=True, data=True) if d["kind"] != "host"]
    return ([compiler.Failures(frozenset([lid])) for lid in links]
            + [compiler.Failures(switches=frozenset([sw])) for sw in graph.switches(g)])


@pytest.mark.parametrize("name", PATCH_PRESETS)
def test_a_recompile_patched_from_the_healthy_plane_equals_a_full_compile_for_every_single_failure(name):
    g = fabric(name)
    for policy in compiler.ROUTING_POLICIES:
        for failures in single_failures(g):
            assert compiler.compile_fabric(g, failures, policy) == \
                compiler.compile_fabric(g, failures, policy, incremental=False), (policy, failures)


@pytest.mark.parametrize("failed", [
    [("p0l0", "p0s0", 0), ("p0l0", "p0s1", 0)],                        # two uplinks of one leaf
    [("p0l0", "p0s0", 0), ("p0l3", "p0s2", 0)],                        # one uplink each of two leaves
    [("p0l0", "p0s0", 0), ("p0l1", "p0s0", 0), ("p1l2", "p1s1", 0)],   # one spine, two leaves; two planes
    [("p0l0", "p0s0", 0), "p0l5"],                                     # a link and a leaf
    [("p0l0", "p0s0", 0), "p0s1"],                                     # a spine: the full computation
])
def test_a_recompile_patched_from_the_healthy_plane_equals_a_full_compile_for_several_failures(failed):
    g = fabric("small-hpn")
    failures = compiler.Failures.of([f for f in failed if isinstance(f, tuple)],
                                    [f for f in failed if isinstance(f, str)])
    for policy in compiler.ROUTING_POLICIES:
        assert compiler.compile_fabric(g, failures, policy) == \
            compiler.compile_fabric(g, failures, policy, incremental=False)


def test_failures_that_touch_more_switches_than_the_patch_limit_route_the_plane_anew(monkeypatch):
    g = fabric("small-hpn")
    failures = compiler.Failures.of([("p0l0", "p0s0", 0), ("p0l1", "p0s0", 0), ("p0l2", "p0s0", 0)])
    ix = compiler.index_of(g)
    routed_anew: list = []
    full = compiler._plane_actions

    def plane_actions(*args):
        routed_anew.append(args)
        return full(*args)

    monkeypatch.setattr(compiler, "_plane_actions", plane_actions)
    touched = compiler._local(ix, 0, failures)
    assert touched is not None
    monkeypatch.setattr(compiler, "PATCH_LIMIT", len(touched))
    compiler._patched_actions(ix, 0, failures)
    assert not routed_anew                      # at the limit: patched
    monkeypatch.setattr(compiler, "PATCH_LIMIT", len(touched) - 1)
    compiler._patched_actions(ix, 0, failures)
    assert routed_anew                          # above it: routed anew...
    for policy in compiler.ROUTING_POLICIES:    # ...and the states are the same
        assert compiler.compile_fabric(g, failures, policy) == \
            compiler.compile_fabric(g, failures, policy, incremental=False)


def test_a_recompile_at_scale_equals_a_full_compile_on_a_sample_of_failures():
    """alibaba-hpn, plane 0 (what the reconciler recompiles): the first leaf's uplinks one by one,
    two leaves' links at once, and the leaf itself."""
    g = fabric("alibaba-hpn")
    ix = compiler.index_of(g)
    plane = [sw.name for sw in ix.planes[0]]
    leaf = next(sw for sw in ix.planes[0] if sw.tier == 1)
    other = [sw for sw in ix.planes[0] if sw.tier == 1][-1]
    samples = [compiler.Failures(frozenset([lid])) for _p, _n, lid in leaf.up[:3]]
    samples.append(compiler.Failures(frozenset([leaf.up[0][2], other.up[-1][2]])))
    samples.append(compiler.Failures(switches=frozenset([leaf.name])))
    for failures in samples:
        assert compiler.compile_fabric(g, failures, switches=plane) == \
            compiler.compile_fabric(g, failures, switches=plane, incremental=False)


def test_a_leaf_spine_link_failure_rebuilds_only_the_switches_whose_routes_change():
    """mini-hpn, p0l0-p0s0: every leaf of plane 0 changes (p0l0 avoids the spine, the others route
    p0l0's prefix around it); both spines keep their healthy state (p0s0 keeps its route: its
    group detours) as the very same value, and so does plane 1."""
    g = fabric("mini-hpn")
    healthy = compiler.compile_fabric(g)
    failed = compiler.compile_fabric(g, compiler.Failures.of([("p0l0", "p0s0", 0)]))
    kept = {n for n in failed if failed[n] is healthy[n]}
    assert kept == {n for n in healthy if n.startswith("p1") or n in ("p0s0", "p0s1")}


# ---- entropy -----------------------------------------------------------------------------

@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 12, 256])
def test_entropy_table_deals_source_port_patterns_evenly(n):
    ports = tuple(range(10, 10 + n))
    flows = compiler.entropy_flows(ports, 1, 7)
    udp = [f for f in flows if dict(f.match).get("ip_proto") == compiler.PROTO_UDP]
    share: dict[Any, Any] = {}
    for f in udp:
        share[f.actions[0][1]] = share.get(f.actions[0][1], 0) + 1
    assert set(share) == set(ports)
    lo, hi = min(share.values()), max(share.values())
    assert hi - lo <= 1 and hi / lo <= 1.34     # 2**B >= 4n patterns when n is no power of two
    if n & (n - 1) == 0:
        assert lo == hi
    # every UDP source port matches exactly one pattern
    mask_val = [dict(f.match)["udp_src"] for f in udp]
    for sport in range(0, 65536, 97):
        assert sum(1 for v, m in mask_val if sport & m == v) == 1


def test_next_hop_set_ids_are_stable_and_distinct():
    assert compiler.set_id((5, 6)) == compiler.set_id((5, 6))
    assert compiler.set_id((5, 6)) != compiler.set_id((5, 7))


# ---- proxy ARP -------------------------------------------------------------------------

def test_arp_is_answered_only_for_hosts_of_the_leafs_plane():
    g = fabric("mini-hpn")
    h5 = {p["plane"]: p for p in graph.host_ports(g, "h5")}
    assert compiler.arp_answer(g, "p0l0", h5[0]["ip"]) == compiler.GATEWAY_MAC
    assert compiler.arp_answer(g, "p0l0", h5[0]["ip"], "per-host") == h5[0]["mac"]
    assert compiler.arp_answer(g, "p0l0", h5[1]["ip"]) is None          # other plane
    assert compiler.arp_answer(g, "p0l0", "10.0.0.250") is None          # no such host
    assert compiler.arp_answer(g, "p0s0", h5[0]["ip"]) is None           # spines answer nothing
    assert compiler.arp_answer(g, "p0l0", "not-an-ip") is None


# ---- counts ------------------------------------------------------------------------------

PRESETS = ["mini-hpn", "fat-tree-4", "mini-rail", "mini-cross-campus", "mini-spine-leaf", "small-hpn",
           "fat-tree-8", "cross-campus", "spine-leaf-rail"]


def loop_guards(g, name):
    """Drop routes the compiler adds beyond the analysis plan: a leaf's own prefix, and a
    spine's own pod when it also has a route up (see hpnlab.fabric.routing.compiler, 'aggregate')."""
    ix = compiler.index_of(g)
    sw = ix.sw[name]
    return 1 if (sw.tier == 1 and sw.up) or (sw.tier == 2 and sw.up) else 0


@pytest.mark.parametrize("name", PRESETS)
def test_route_counts_equal_the_analysis_formulas(name):
    g = fabric(name)
    plan = analysis.route_counts(g)
    agg = compiler.route_summary(g, "aggregate")["switches"]
    host = compiler.route_summary(g, "host-routes")["switches"]
    for sw, formula in plan.items():
        assert agg[sw]["minimum_routes"] == formula["aggregated"], sw
        assert agg[sw]["routes"] == formula["aggregated"] + loop_guards(g, sw), sw
        assert host[sw]["routes"] == formula["host_routes"], sw


def test_route_summary_sums_switches_into_pods():
    g = fabric("fat-tree-4")
    s = compiler.route_summary(g, "aggregate")
    assert set(s["pods"]) == {f"c0/pod{p}" for p in range(4)} | {"core"}
    assert sum(p["flows"] for p in s["pods"].values()) == s["totals"]["flows"]
    assert s["pods"]["core"]["switches"] == 4


@pytest.mark.slow
def test_route_counts_at_130k_equal_the_analysis_formulas():
    """Plane 0's switches: the planes are copies (one generator, the same parameters, the same
    ports; test_analysis counts every plane's switches) and the compiler compiles each plane on
    its own, so one plane stands for the four at a quarter of the time."""
    g = fabric("hpn-130k")
    plan = analysis.route_counts(g)
    plane0 = [sw.name for sw in compiler.index_of(g).planes[0]]
    try:
        agg = compiler.compile_fabric(g, None, "aggregate", switches=plane0)
        assert {sw: st.route_count - loop_guards(g, sw) for sw, st in agg.items()} == \
            {sw: plan[sw]["aggregated"] for sw in plane0}
        assert max(st.route_count for st in agg.values()) == 512
        del agg
        host = compiler.compile_fabric(g, None, "host-routes", switches=plane0)
        assert {sw: st.route_count for sw, st in host.items()} == {sw: plan[sw]["host_routes"] for sw in plane0}
        assert max(st.route_count for st in host.values()) == 131_072
    finally:
        g.graph.pop("_controller_index", None)     # the compiler's caches: not kept for the session
