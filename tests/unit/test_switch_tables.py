"""The simulated switch's table decisions (fabric/switches/tables.py): plain values in, plain values out."""
from __future__ import annotations

from hpnlab.fabric.switches.tables import FlowMod, GroupMod, Tables, covers

COOKIE = 0x68706E6C61620000
ROUTE = (("eth_type", 0x0800), ("ipv4_dst", (0x0A000000, 0xFFFFFF00)))
HOST = (("eth_type", 0x0800), ("ipv4_dst", 0x0A000001))


def add(t: Tables, table: int = 1, priority: int = 10, match: tuple = ROUTE, cookie: int = COOKIE,
        outputs: frozenset = frozenset({1}), groups: frozenset = frozenset(), body: bytes = b"i1") -> str | None:
    return t.flow_mod(FlowMod("add", table, priority, match, cookie, 0, outputs=outputs, groups=groups,
                              match_body=b"m", instructions_body=body))


def test_an_add_of_the_same_table_priority_and_match_replaces_the_entry_and_its_cookie():
    t = Tables()
    add(t, body=b"old", cookie=1)
    assert add(t, body=b"new", cookie=2) is None
    assert len(t.flows) == 1
    entry = t.flows[1, 10, ROUTE]
    assert (entry.instructions_body, entry.cookie) == (b"new", 2)


def test_a_new_entry_beyond_the_flow_limit_is_refused_as_table_full():
    t = Tables(flow_limit=2)
    add(t, priority=1)
    add(t, priority=2)
    assert add(t, priority=3) == "table_full"
    assert len(t.flows) == 2


def test_replacing_an_entry_at_the_flow_limit_is_not_refused():
    t = Tables(flow_limit=1)
    add(t, body=b"a")
    assert add(t, body=b"b") is None


def test_a_flow_sending_to_a_missing_group_is_refused_as_bad_out_group():
    t = Tables()
    assert add(t, groups=frozenset({7})) == "bad_out_group"
    assert not t.flows


def test_a_table_beyond_the_switch_s_tables_is_refused():
    assert add(Tables(), table=254) == "bad_table_id"


def test_modify_replaces_the_instructions_of_every_selected_entry_and_keeps_its_cookie():
    t = Tables()
    add(t, match=HOST, priority=20, cookie=5, body=b"a")
    assert t.flow_mod(FlowMod("modify", 1, 0, ROUTE, 9, 0, outputs=frozenset({3}), instructions_body=b"z")) is None
    e = t.flows[1, 20, HOST]
    assert (e.instructions_body, e.cookie, e.outputs) == (b"z", 5, frozenset({3}))


def test_modify_adds_nothing_when_nothing_is_selected():
    t = Tables()
    t.flow_mod(FlowMod("modify", 1, 10, ROUTE, instructions_body=b"z"))
    assert not t.flows


def test_modify_strict_changes_only_the_entry_of_that_priority_and_match():
    t = Tables()
    add(t, priority=10, body=b"a")
    add(t, priority=11, body=b"a")
    t.flow_mod(FlowMod("modify_strict", 1, 11, ROUTE, instructions_body=b"z"))
    assert [t.flows[1, p, ROUTE].instructions_body for p in (10, 11)] == [b"a", b"z"]


def test_a_non_strict_delete_takes_every_entry_at_least_as_specific_as_its_match():
    t = Tables()
    add(t, match=HOST, priority=20)
    add(t, match=ROUTE, priority=10)
    add(t, match=(("eth_type", 0x0800), ("ipv4_dst", 0x0B000001)), priority=20)
    t.flow_mod(FlowMod("delete", None, 0, ROUTE))
    assert list(t.flows) == [(1, 20, (("eth_type", 0x0800), ("ipv4_dst", 0x0B000001)))]


def test_a_less_specific_entry_is_not_selected_by_a_more_specific_match():
    assert covers(ROUTE, HOST)
    assert not covers(HOST, ROUTE)


def test_a_delete_strict_takes_only_the_entry_of_that_priority():
    t = Tables()
    add(t, priority=10)
    add(t, priority=11)
    t.flow_mod(FlowMod("delete_strict", 1, 10, ROUTE))
    assert list(t.flows) == [(1, 11, ROUTE)]


def test_a_delete_with_a_cookie_mask_takes_only_the_entries_of_that_cookie():
    t = Tables()
    add(t, priority=10, cookie=COOKIE)
    add(t, priority=11, cookie=0x68706E6C6C647000)      # the LLDP rule's cookie
    t.flow_mod(FlowMod("delete", None, 0, (), cookie=COOKIE, cookie_mask=0xFFFFFFFFFFFFFFFF))
    assert list(t.flows) == [(1, 11, ROUTE)]


def test_a_delete_with_cookie_mask_zero_takes_every_cookie():
    t = Tables()
    add(t, priority=10, cookie=1)
    add(t, priority=11, cookie=2)
    t.flow_mod(FlowMod("delete", None, 0, (), cookie=COOKIE, cookie_mask=0))
    assert not t.flows


def test_a_delete_with_an_out_port_takes_only_entries_that_output_there():
    t = Tables()
    add(t, priority=10, outputs=frozenset({1}))
    add(t, priority=11, outputs=frozenset({2}))
    t.flow_mod(FlowMod("delete", 1, 0, (), out_port=2))
    assert list(t.flows) == [(1, 10, ROUTE)]


def test_a_delete_of_one_table_leaves_the_others():
    t = Tables()
    add(t, table=0)
    add(t, table=1)
    t.flow_mod(FlowMod("delete", 0, 0, ()))
    assert list(t.flows) == [(1, 10, ROUTE)]


def test_adding_a_group_id_in_use_is_refused_as_group_exists():
    t = Tables()
    assert t.group_mod(GroupMod("add", 7, "ff", body=b"a")) is None
    assert t.group_mod(GroupMod("add", 7, "ff", body=b"b")) == "group_exists"
    assert t.groups[7].body == b"a"


def test_modifying_an_unknown_group_is_refused_as_unknown_group():
    t = Tables()
    assert t.group_mod(GroupMod("modify", 7, "ff")) == "unknown_group"
    assert not t.groups


def test_modify_replaces_a_group_s_kind_and_buckets():
    t = Tables()
    t.group_mod(GroupMod("add", 7, "ff", body=b"a"))
    t.group_mod(GroupMod("modify", 7, "indirect", body=b"b"))
    assert (t.groups[7].kind, t.groups[7].body) == ("indirect", b"b")


def test_a_group_beyond_the_group_limit_is_refused():
    t = Tables(group_limit=1)
    t.group_mod(GroupMod("add", 1, "ff"))
    assert t.group_mod(GroupMod("add", 2, "ff")) == "out_of_groups"


def test_deleting_a_group_takes_the_flows_that_send_to_it():
    t = Tables()
    t.group_mod(GroupMod("add", 7, "ff"))
    add(t, priority=10, groups=frozenset({7}))
    add(t, priority=11)
    assert t.group_mod(GroupMod("delete", 7)) is None
    assert list(t.flows) == [(1, 11, ROUTE)] and not t.groups


def test_deleting_an_unknown_group_is_no_error():
    assert Tables().group_mod(GroupMod("delete", 7)) is None


def test_deleting_every_group_takes_every_flow_that_sends_to_one():
    t = Tables()
    for gid in (1, 2):
        t.group_mod(GroupMod("add", gid, "indirect"))
        add(t, priority=gid, groups=frozenset({gid}))
    t.group_mod(GroupMod("delete", None))
    assert not t.groups and not t.flows


def test_a_group_chained_to_a_group_not_yet_added_is_taken_as_open_vswitch_takes_it():
    assert Tables().group_mod(GroupMod("add", 1, "ff", groups=frozenset({2}))) is None


def test_with_strict_chaining_a_group_chained_to_a_missing_group_is_refused():
    t = Tables(strict_chaining=True)
    assert t.group_mod(GroupMod("add", 1, "ff", groups=frozenset({2}))) == "bad_out_group"


def test_a_replaced_flow_no_longer_counts_as_a_user_of_its_old_group():
    t = Tables()
    t.group_mod(GroupMod("add", 7, "indirect"))
    add(t, groups=frozenset({7}))
    add(t, groups=frozenset())          # replaced: no group now
    t.group_mod(GroupMod("delete", 7))
    assert list(t.flows) == [(1, 10, ROUTE)]
