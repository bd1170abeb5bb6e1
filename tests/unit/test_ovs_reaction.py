"""The netlink requests of ovs-vswitchd's main thread, sorted from strace output (tools/probes/ovs_reaction.py)."""
from __future__ import annotations

import ovs_reaction

T0 = 1796316748.35
LINES = [
    '1796316748.350840 sendto(19, [{nlmsg_len=17, nlmsg_type=RTM_GETROUTE, nlmsg_flags=NLM_F_REQUEST|NLM_F_ACK|'
    'NLM_F_DUMP, nlmsg_seq=209750, nlmsg_pid=-2079999322}, {rtm_family=AF_UNSPEC, ...}], 17, 0, NULL, 0) = 17',
    '1796316748.351232 sendto(386, [{nlmsg_len=20, nlmsg_type=RTM_GETLINK, nlmsg_flags=NLM_F_REQUEST|NLM_F_DUMP, '
    'nlmsg_seq=1796316748, nlmsg_pid=0}, {ifi_family=AF_UNSPEC, ...}], 20, 0, {sa_family=AF_NETLINK, nl_pid=0, '
    'nl_groups=00000000}, 12) = 20',
    '1796316748.356208 sendmsg(19, {msg_name=NULL, msg_namelen=0, msg_iov=[{iov_base="8\\0\\0\\0\\22\\0\\1\\0Y3\\3\\0'
    '\\246\\272\\5\\204\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\16\\0\\3\\0p0s1-eth4\\0\\0\\0\\10\\0\\35\\0\\10\\0'
    '\\0\\0", iov_len=56}], msg_iovlen=1, msg_controllen=0, msg_flags=0}, 0) = 56',
    '1796316748.356508 sendmsg(19, {msg_name=NULL, msg_namelen=0, msg_iov=[{iov_base="4\\0\\0\\0\\22\\0\\1\\0X3\\3\\0'
    '\\246\\272\\5\\204\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\t\\0\\3\\0p0s1\\0\\0\\0\\0\\10\\0\\35\\0\\10\\0\\0'
    '\\0", iov_len=52}], msg_iovlen=1, msg_controllen=0, msg_flags=0}, 0) = 52',
    '1796316748.357000 ioctl(20, SIOCGIFFLAGS, {ifr_name="lo"}) = 0',
]


def test_requests_decode_straces_netlink_messages_and_the_raw_per_interface_queries():
    reqs = ovs_reaction.requests(LINES, T0)
    assert [(r["type"], r["dump"], r["ifname"]) for r in reqs] == [
        ("RTM_GETROUTE", True, None), ("RTM_GETLINK", True, None),
        ("RTM_GETLINK", False, "p0s1-eth4"), ("RTM_GETLINK", False, "p0s1")]
    assert reqs[0]["ms"] == 0.84


def test_requests_are_sorted_into_dumps_and_per_interface_queries_from_the_fault_on():
    kinds = ovs_reaction.sort(ovs_reaction.requests(LINES, T0), since_ms=1.0)
    assert set(kinds) == {"link dump", "per-interface link query"}        # the route dump came before 1 ms
    q = kinds["per-interface link query"]
    assert q["count"] == 2 and q["interfaces"] == 2
    assert q["first_ms"] == 6.21 and q["last_ms"] == 6.51


def test_coverage_reads_the_totals_and_a_counter_never_hit_is_zero():
    text = ("Event coverage, avg rate over last: 5 seconds, last minute, last hour,  hash=1a2b3c4d:\n"
            "bridge_reconfigure         0.0/sec     4.733/sec        1.1225/sec   total: 4046\n"
            "rev_port_toggled           0.0/sec     0.000/sec        0.0331/sec   total: 122\n"
            "175 events never hit\n")
    c = ovs_reaction.coverage(text)
    assert c["bridge_reconfigure"] == 4046 and c["rev_port_toggled"] == 122
    assert c["rev_reconfigure"] == 0
