"""The web view's data layer (hpnlab.fabric.web.view, .loads, .server's pure parts): pure, no root."""
from __future__ import annotations

import json
import urllib.request

import pytest
from support.fabrics import fabric
from support.paths import REPO

from hpnlab.fabric.errors import UserError
from hpnlab.fabric.scenario import graph, spec
from hpnlab.fabric.web import server, view


@pytest.fixture(scope="module")
def mini():
    return fabric("mini-hpn")


@pytest.fixture(scope="module")
def lay(mini):
    return view.layout(mini)


def test_layout_has_every_switch_and_link_once_with_stable_ids(mini, lay):
    switches = {n for n, d in mini.nodes(data=True) if d["tier"] > 0}
    assert {n["id"] for n in lay["nodes"] if n["tier"] > 0} == switches
    assert len({n["el"] for n in lay["nodes"]}) == len(lay["nodes"])
    assert sorted(lk["id"] for lk in lay["links"]) == sorted(
        view.link_id(mini, u, v, k) for u, v, k in mini.edges(keys=True))
    assert view.layout(graph.build(spec.load("mini-hpn"))) == lay      # the same scenario, the same drawing


def test_layout_has_one_panel_per_plane_and_a_host_in_each(mini, lay):
    planes = mini.graph["scenario"].planes
    assert [p["plane"] for p in lay["panels"]] == list(range(planes))
    hosts = [n for n, d in mini.nodes(data=True) if d["tier"] == 0]
    assert sorted(n["el"] for n in lay["nodes"] if n["tier"] == 0) == sorted(
        f"{h}@{p}" for h in hosts for p in range(planes))


def test_tiers_are_rows_hosts_below_leaves_below_spines(lay):
    y = {t: {n["y"] for n in lay["nodes"] if n["tier"] == t} for t in (0, 1, 2)}
    assert all(len(v) == 1 for v in y.values())
    assert y[0].pop() > y[1].pop() > y[2].pop()


def test_each_link_is_drawn_inside_its_planes_panel(lay):
    panel_of = {n["el"]: n["panel"] for n in lay["nodes"]}
    for lk in lay["links"]:
        assert panel_of[lk["ea"]] == panel_of[lk["eb"]] == lk["plane"]


def test_host_links_carry_their_rail_and_leaves_their_rails(mini, lay):
    for lk in lay["links"]:
        if lk["kind"] == "host":
            assert lk["rail"] == mini.edges[lk["a"], lk["b"], lk["key"]]["rail"]
    assert all(n["rails"] == list(mini.nodes[n["id"]]["rails"]) for n in lay["nodes"] if n["role"] == "leaf")


def test_long_haul_links_are_marked():
    g = fabric("mini-cross-campus")
    lay = view.layout(g)
    marked = {lk["id"] for lk in lay["links"] if lk["long_haul"]}
    assert marked and marked == {view.link_id(g, u, v, k) for u, v, k, d in g.edges(keys=True, data=True)
                                 if d["kind"] == "long-haul"}


def test_a_switch_port_maps_to_its_link_and_direction(mini, lay):
    ix = view.Index.of(lay)
    for u, v, k, d in mini.edges(keys=True, data=True):
        lid = view.link_id(mini, u, v, k)
        a = lid.split("-")[0]
        for end in (u, v):
            if mini.nodes[end]["tier"] > 0:
                assert ix.port[end, d["ports"][end]] == (lid, "ab" if end == a else "ba")


def test_telemetry_rows_load_the_sending_direction_and_a_hosts_uplink_from_rx(lay):
    ix = view.Index.of(lay)
    up = next(lk for lk in lay["links"] if lk["kind"] == "fabric")
    host = next(lk for lk in lay["links"] if lk["kind"] == "host")
    rows = [{"switch": up["a"], "port": up["ports"][up["a"]], "tx_mbps": 8.0, "utilisation": 0.4, "rx_mbps": 0,
             "ce_marked_pps": 12.5, "ce_fraction": 0.1, "drops": 3, "queue_bytes": 9000},
            {"switch": host["b"], "port": host["ports"][host["b"]], "tx_mbps": 1.0, "utilisation": 0.1,
             "rx_mbps": 5.0}]
    loads = view.link_loads(ix, rows)
    assert loads[up["id"]]["ab"] == {"util": 0.4, "mbps": 8.0, "ce_pps": 12.5, "ce_fraction": 0.1, "drops": 3,
                                     "queue_bytes": 9000}
    assert "ba" not in loads[up["id"]]
    assert loads[host["id"]]["ba"]["util"] == 0.1
    assert loads[host["id"]]["ab"]["mbps"] == 5.0
    assert loads[host["id"]]["ab"]["util"] == pytest.approx(5.0 / host["rate_mbps"])


def test_a_failed_link_is_red_both_ways_and_repair_makes_it_up_again(lay):
    ix = view.Index.of(lay)
    down = {"action": "link_down", "target": ["p0l0", "p0s0"], "key": None, "side": None}
    st = view.fold_events(ix, [down])
    fr = view.frame(lay, 1.0, {}, st)
    e = fr["links"]["p0l0-p0s0/0"]
    assert e["state"] == "down" and e["ab"]["colour"] == e["ba"]["colour"] == view.FAILED
    repairs = view.repair_events(ix, st, ["p0l0", "p0s0"])
    assert repairs == [{"action": "link_up", "link": ["p0l0", "p0s0"], "key": 0}]
    view.fold_events(ix, [{"action": "link_up", "target": ["p0l0", "p0s0"], "key": 0, "side": None}], st)
    assert view.frame(lay, 2.0, {}, st)["links"] == {}


def test_a_gray_failure_is_red_only_in_the_dropping_direction(lay):
    ix = view.Index.of(lay)
    st = view.fold_events(ix, [{"action": "link_drop", "target": ["p0l0", "p0s0"], "key": None, "side": "p0s0"}])
    e = view.frame(lay, 0.0, {}, st)["links"]["p0l0-p0s0/0"]
    assert e["state"] == "gray" and e["gray_side"] == "p0s0"
    assert e["ba"]["colour"] == view.FAILED and e["ab"]["colour"] == view.IDLE
    assert view.repair_events(ix, st, ["p0l0", "p0s0"]) == [
        {"action": "link_restore", "link": ["p0l0", "p0s0"], "key": 0, "side": "p0s0"}]


def test_a_switch_down_fails_all_its_links_and_the_switch(lay):
    ix = view.Index.of(lay)
    st = view.fold_events(ix, [{"action": "switch_down", "target": ["p1s1"]}])
    fr = view.frame(lay, 0.0, {}, st)
    assert fr["switches_down"] == ["p1s1"]
    assert {lid for lid, e in fr["links"].items() if e["state"] == "down"} == set(ix.of_node["p1s1"])
    assert view.repair_events(ix, st, ["p1s1"]) == [{"action": "switch_up", "switch": "p1s1"}]


def test_utilisation_colours_run_from_idle_to_full_and_never_red():
    cols = [view.util_colour(u) for u in (0.0, 0.1, 0.5, 0.9, 1.0, 3.0)]
    assert cols[0] == view.IDLE and len(set(cols[:5])) == 5 and cols[4] == cols[5]
    assert view.FAILED not in cols


def _run_doc():
    """A stored `hpnlab run` document: its telemetry summary, a timeline record, start and length."""
    return {"meta": {"time": 1000.0, "wall_s": 4.0},
            "results": [{"timeline": [{"action": "link_down", "target": ["p0l0", "p0s0"], "key": None,
                                       "side": None, "wall": 998.0, "applied_s": 1.5}]}],
            "telemetry": {"ports": {"p0l1:6": {"peer": "p0s1", "t": [0.0, 1.0, 2.0], "tx_mbps": [5.0, 10.0, 20.0],
                                               "utilisation": [0.25, 0.5, 1.0], "rx_mbps": [1.0, 1.0, 0.0]}}}}


def test_replay_shows_at_each_moment_the_latest_sample_and_the_failures_applied_by_then(lay):
    frames = view.replay_frames(lay, _run_doc(), step_s=0.5)
    at = {f["t"]: f for f in frames}
    assert at[1.5]["links"]["p0l1-p0s1/0"]["ab"]["util"] == 0.5
    assert "p0l0-p0s0/0" not in at[1.5]["links"]                       # the failure came at +2 s (wall 998)
    assert at[2.0]["links"]["p0l0-p0s0/0"]["state"] == "down"
    assert at[2.0]["links"]["p0l1-p0s1/0"]["ab"]["util"] == 1.0
    assert frames[-1]["t"] >= 4.0


def test_replay_and_live_frames_draw_the_same_picture_at_the_same_moment(lay):
    """Live: the telemetry file's sample line and the fault as it is applied; replay: the run's
    summarised telemetry and timeline records. The picture at t = 2 s must be the same."""
    ix = view.Index.of(lay)
    doc = _run_doc()
    live_rows = [{"switch": "p0l1", "port": 6, "peer": "p0s1", "tx_mbps": 20.0, "utilisation": 1.0, "rx_mbps": 0.0}]
    live_st = view.fold_events(ix, [doc["results"][0]["timeline"][0]])
    live = view.frame(lay, 2.0, view.link_loads(ix, live_rows), live_st)
    replayed = view.frame_at(view.replay_frames(lay, doc), 2.0)
    assert view.link_colours(replayed, lay) == view.link_colours(live, lay)
    assert view.svg(lay, replayed) == view.svg(lay, live)


def test_svg_has_an_element_per_link_half_and_switch_coloured_by_the_frame(lay):
    ix = view.Index.of(lay)
    st = view.fold_events(ix, [{"action": "link_down", "target": ["p0l0", "p0s0"], "key": None, "side": None}])
    text = view.svg(lay, view.frame(lay, 0.0, {}, st))
    assert text.count('class="lk') == 2 * len(lay["links"])
    assert all(f'id="N:{n}"' in text for n in ("p0l0", "p1s1", "h3@1"))
    assert 'id="L:p0l0-p0s0/0:ab" class="lk" data-link="p0l0-p0s0/0" ' in text
    assert text.count(f'stroke="{view.FAILED}"') == 2


def test_hpn_130k_is_drawn_aggregated_by_plane_pod_and_tier():
    g = fabric("hpn-130k")
    lay = view.layout(g)
    assert lay["aggregated"] and len(lay["links"]) < 5000 and len(lay["nodes"]) < 1000
    assert sum(lk["members"] for lk in lay["links"]) == g.number_of_edges()
    planes = g.graph["scenario"].planes
    assert sum(lk["rate_gbps"] for lk in lay["links"]) == pytest.approx(
        sum(d["rate_gbps"] for _, _, d in g.edges(data=True)))
    assert [p["plane"] for p in lay["panels"]] == list(range(planes))
    assert sum(n["size"] for n in lay["nodes"] if n["tier"] > 0) == lay["counts"]["switches"]


def test_aggregation_keeps_link_totals_on_a_small_fabric(mini):
    lay = view.aggregated_layout(mini, bins=2)
    assert sum(lk["members"] for lk in lay["links"]) == mini.number_of_edges()
    assert {n["id"].split("/")[2] for n in lay["nodes"]} == {"host", "leaf", "spine"}


def _busiest_share(step):
    """The busiest link's utilisation in a model step: busy for all of the step but its latency."""
    return 1 - step["latency_us"] / step["time_us"]


def test_model_loads_are_per_step_utilisations_of_real_links(mini, lay):
    from hpnlab.fabric.web import loads
    doc = loads.model_loads(mini, "all_reduce_hd", 1 << 20, lay=lay)
    steps = doc["loads"]["steps"]
    modelled = doc["model"]["steps"]
    assert len(steps) == len(modelled) > 1
    assert [s["time_us"] for s in steps] == pytest.approx([m["time_s"] * 1e6 for m in modelled])   # the model's
    ids = {lk["id"] for lk in lay["links"]}
    for s in steps:
        assert set(s["links"]) <= ids
        assert all(0 <= x <= 1.0 + 1e-6 for u in s["links"].values() for x in u)
        assert max(x for u in s["links"].values() for x in u) == pytest.approx(_busiest_share(s), abs=1e-4)
        assert all(u[2:] == u[:2] for u in s["links"].values())     # drawn link by link: a link is its own peak
    frames = view.replay_frames(lay, doc)
    assert len(frames) == len(steps) and frames[1]["t"] == pytest.approx(steps[0]["time_us"] * 1e-6, abs=1e-3)


@pytest.fixture(scope="module")
def mini_net(mini):
    from hpnlab.fabric.model import flow as model
    return model.Network(mini)


@pytest.mark.parametrize("routing,collective,exact_pairs", [
    ("flow", "permutation", None), ("flowlet", "all_reduce", None), ("spray", "all_to_all", None),
    ("adaptive", "all_to_all", None), ("flow", "all_to_all", 48)])
def test_model_step_loads_carry_every_byte_at_the_models_step_time(mini, mini_net, routing, collective,
                                                                   exact_pairs):
    """Each host's up links carry what its ranks send, its down links what they receive (a sampled
    step's pairs scaled); no link carries more than its capacity over the step; the step's drain
    time is the model's own (``model.run_step``)."""
    from hpnlab.fabric.model import flow as model
    from hpnlab.fabric.web import loads
    job = model.make_job(mini, None, "packed", 1)
    kw = {"exact_pairs": exact_pairs} if exact_pairs else {}
    step = model.steps(collective, job, 1 << 20, max_steps=2, seed=1, rails=1, routing=routing, **kw)[-1]
    assert (step.scale > 1) == bool(exact_pairs)
    load = loads.step_load(mini_net, job, step, routing, 4, 1, 1.0)
    _leaf, up, down, host = mini_net.rank_table(job)
    crosses = host[step.src] != host[step.dst]
    for h in range(len(mini_net.hosts)):
        sent = step.nbytes[crosses & (host[step.src] == h)].sum() * 8 * step.scale
        got = step.nbytes[crosses & (host[step.dst] == h)].sum() * 8 * step.scale
        assert load.bits[up[host == h].ravel()].sum() == pytest.approx(sent)
        assert load.bits[down[host == h].ravel()].sum() == pytest.approx(got)
    assert (load.bits <= mini_net.cap * 1e9 * load.span_s * (1 + 1e-9)).all()
    timed = model.run_step(mini_net, job, (step.src, step.dst), step.nbytes, routing, 4, 1, 1.0, salt=step.salt,
                           scale=step.scale)
    assert load.span_s + load.latency_s == pytest.approx(timed.time_s)


def test_controller_state_reads_the_controllers_prometheus_metrics():
    text = ("# TYPE hpnlab_switches_connected gauge\nhpnlab_switches_connected 12.0\n"
            "# TYPE hpnlab_recompiles counter\nhpnlab_recompiles_total 3.0\n"
            "# TYPE hpnlab_last_convergence_seconds gauge\nhpnlab_last_convergence_seconds 0.0421\n")
    assert view.controller_state(text) == {"switches_connected": 12, "recompiles": 3, "convergence_s": 0.0421}


@pytest.mark.parametrize("text,want", [(None, ("127.0.0.1", 8765)), ("", ("127.0.0.1", 8765)),
                                       ("0.0.0.0:9000", ("0.0.0.0", 9000)), (":9001", ("127.0.0.1", 9001)),
                                       ("9002", ("127.0.0.1", 9002)), ("[::1]:9003", ("::1", 9003))])
def test_web_address_defaults_to_loopback(text, want):
    assert server.parse_addr(text) == want


@pytest.mark.parametrize("text", ["example.com:80", "127.0.0.1:99999", "1.2.3:4"])
def test_a_bad_web_address_is_one_line(text):
    with pytest.raises(UserError, match="--web"):
        server.parse_addr(text)


def test_only_loopback_counts_as_local():
    assert server.is_loopback("127.0.0.1") and server.is_loopback("::1") and server.is_loopback("::ffff:127.0.0.1")
    assert not server.is_loopback("10.0.0.1") and not server.is_loopback("")


def test_replay_server_serves_the_page_the_frames_and_a_still_and_refuses_injection(lay):
    frames = view.replay_frames(lay, _run_doc())
    srv = server.WebServer(server.ReplaySource(lay, frames), "127.0.0.1", 0).start()
    try:
        def get(path):
            with urllib.request.urlopen(srv.url + path, timeout=5) as r:
                return r.read().decode()
        assert "app.js" in get("")
        assert json.loads(get("layout.json"))["mode"] == "replay"
        assert len(json.loads(get("frames.json"))) == len(frames)
        assert get("still.svg?t=2") == view.svg(lay, view.frame_at(frames, 2.0))
        req = urllib.request.Request(srv.url + "inject", data=b'{"action": "link_down"}', method="POST")
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=5)
        assert err.value.code == 400
    finally:
        srv.stop()


def test_hpnlab_web_replay_writes_the_still_of_a_moment(tmp_path, lay, capsys):

    from hpnlab.cli.main import main
    stored = REPO / "tests" / "support" / "data" / "web-replay-run.json"
    out = tmp_path / "t2.svg"
    assert main(["web", "replay", str(stored), "--still", str(out), "--at", "2"]) == 0
    frames = view.replay_frames(lay, json.loads(stored.read_text()))
    assert out.read_text() == view.svg(lay, view.frame_at(frames, 2.0))


def test_hpnlab_web_replay_of_a_file_with_nothing_to_replay_is_one_line(tmp_path, capsys):
    from hpnlab.cli.main import main
    empty = tmp_path / "empty.json"
    empty.write_text('{"meta": {"scenario": "mini-hpn"}}')
    assert main(["web", "replay", str(empty)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nothing to replay" in err


def test_aggregated_model_loads_show_a_groups_mean_and_its_busiest_link(mini, lay):
    from hpnlab.fabric.web import loads
    agg = view.aggregated_layout(mini, bins=1)
    doc = loads.model_loads(mini, "all_to_all", 1 << 20, lay=agg)
    per_link = loads.model_loads(mini, "all_to_all", 1 << 20, lay=lay)
    ids = {lk["id"] for lk in agg["links"]}

    def carried(layout, step):       # every link's utilisation times its capacity, summed: the step's bits / time
        rate = {lk["id"]: lk["rate_gbps"] for lk in layout["links"]}
        return sum((u[0] + u[1]) * rate[lid] for lid, u in step["links"].items())
    for s, d in zip(doc["loads"]["steps"], per_link["loads"]["steps"], strict=True):
        assert set(s["links"]) <= ids
        assert all(u[2] >= u[0] - 1e-9 and u[3] >= u[1] - 1e-9 for u in s["links"].values())
        assert max(max(u[2:]) for u in s["links"].values()) == pytest.approx(_busiest_share(s), abs=1e-4)
        assert carried(agg, s) == pytest.approx(carried(lay, d), rel=1e-3)


def test_adaptive_loads_follow_the_max_min_split_where_paths_differ():
    """Oversubscribed leaf-spine links and one failed: a pair's paths get unequal max-min rates,
    and each path carries its rate's share of the pair's bytes (an even split would overload a
    link by 25% here), never more than a link's capacity over the model's step time."""
    from hpnlab.fabric.model import flow as model
    from hpnlab.fabric.web import loads
    g = fabric("mini-hpn", leaf_spine_rate_gbps=50.0, oversubscription=None)
    failed = min((u, v, k) for u, v, k, d in g.edges(keys=True, data=True) if d["kind"] == "fabric")
    net = model.Network(g, {failed})
    job = model.make_job(g, None, "packed", 1)
    step = model.steps("permutation", job, 1 << 20, max_steps=1, seed=1, rails=1, routing="adaptive")[0]
    load = loads.step_load(net, job, step, "adaptive", 4, 1, 1.0)
    timed = model.run_step(net, job, (step.src, step.dst), step.nbytes, "adaptive", 4, 1, 1.0)
    assert load.span_s + load.latency_s == pytest.approx(timed.time_s)
    assert (load.bits <= net.cap * 1e9 * load.span_s * (1 + 1e-9)).all()


def test_a_stalled_model_run_writes_strict_json_with_no_step_time(mini):
    """A host cut off on every plane: the model's collective never completes (inf), the document
    says so with nulls (strict JSON, which a browser parses) and still replays."""
    from hpnlab.fabric.web import loads
    h = next(n for n, d in mini.nodes(data=True) if d["tier"] == 0)
    host_links = {(u, v, k) for u, v, k, d in mini.edges(keys=True, data=True) if d["kind"] == "host" and h in (u, v)}
    doc = loads.model_loads(mini, "permutation", 1 << 20, failed=host_links)
    assert doc["model"]["stalled_connections"] > 0 and doc["model"]["time_s"] is None
    assert [s["time_us"] for s in doc["loads"]["steps"]] == [None]
    assert json.loads(json.dumps(doc, allow_nan=False)) == doc
    assert len(view.replay_frames(view.layout(mini), doc)) == 1


def test_hpnlab_web_model_writes_a_document_that_replays(tmp_path, capsys):
    from hpnlab.cli.main import main
    out = tmp_path / "m.json"
    assert main(["web", "model", "mini-hpn", "--collective", "all_reduce_hd", "--routing", "spray", "--size", "1M",
                 "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["loads"]["routing"] == "spray" and doc["model"]["routing"] == "spray"
    assert main(["web", "replay", str(out), "--still", str(tmp_path / "m.svg"), "--at", "0"]) == 0
    assert (tmp_path / "m.svg").read_text().startswith("<svg")


def test_model_loads_refuse_a_network_whose_links_follow_another_edge_order(mini, mini_net):
    import networkx as nx

    from hpnlab.fabric.web import loads
    shuffled = nx.MultiGraph(**mini.graph)
    shuffled.add_nodes_from(mini.nodes(data=True))
    shuffled.add_edges_from(reversed(list(mini.edges(keys=True, data=True))))
    loads.model_loads(mini, "permutation", 1 << 20, network=mini_net)
    with pytest.raises(ValueError, match="not built from this fabric graph"):
        loads.model_loads(shuffled, "permutation", 1 << 20, network=mini_net)


# ---- priority flow control: paused links ----------------------------------------------------------

def test_a_paused_transmitter_is_drawn_paused_on_its_direction_towards_the_pausing_port():
    from hpnlab.fabric.scenario import graph as fgraph
    from hpnlab.fabric.scenario import spec as fspec
    from hpnlab.fabric.web import view as v

    g = fgraph.build(fspec.load("mini-hpn"))
    lay = v.layout(g)
    ix = v.Index.of(lay)
    lid, towards_spine = ix.port["p0s0", 1]         # p0s0's port 1 faces a leaf: the leaf sends "the other way"
    held = v.paused_directions(ix, [("p0s0", 1)])
    other = "ba" if towards_spine == "ab" else "ab"
    assert held == {(lid, other)}
    fr = v.frame(lay, 0.0, {}, paused=held, ix=ix)
    assert fr["links"][lid][other]["paused"] and fr["links"][lid][other]["colour"] == v.PAUSED
    assert not fr["links"][lid][towards_spine].get("paused")
    assert v.link_colours(fr, lay)[f"L:{lid}:{other}"] == v.PAUSED


def test_a_failed_link_is_drawn_failed_even_if_it_was_paused():
    from hpnlab.fabric.scenario import graph as fgraph
    from hpnlab.fabric.scenario import spec as fspec
    from hpnlab.fabric.web import view as v

    g = fgraph.build(fspec.load("mini-hpn"))
    lay = v.layout(g)
    ix = v.Index.of(lay)
    lid, _ = ix.port["p0s0", 1]
    link = ix.links[lid]
    st = v.fold_events(ix, [{"action": "link_down", "target": [link["a"], link["b"]], "key": link["key"]}])
    fr = v.frame(lay, 0.0, {}, st, paused=v.paused_directions(ix, [("p0s0", 1)]), ix=ix)
    assert all(fr["links"][lid][d]["colour"] == v.FAILED and not fr["links"][lid][d].get("paused")
               for d in ("ab", "ba"))
