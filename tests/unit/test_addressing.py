"""Address text <-> integers, and interface names: one helper each, used across the project."""
import ipaddress

import pytest

from hpnlab.fabric.scenario import graph, spec
from hpnlab.fabric.scenario.addressing import ip_int, ip_str, prefix_int


@pytest.mark.parametrize("text", ["0.0.0.0", "10.0.0.5", "10.255.17.3", "255.255.255.255"])
def test_ip_int_reads_a_dotted_quad_as_ipaddress_does(text):
    assert ip_int(text) == int(ipaddress.IPv4Address(text))


@pytest.mark.parametrize("text", ["10.1", "10.0.0", "1.2.3.4.5", "010.0.0.1", "0x0a.0.0.1", "1.2.3.256",
                                  " 1.2.3.4", "1.2.3.4 ", "", "a.b.c.d", "1.2.3.-4"])
def test_ip_int_refuses_what_is_not_a_dotted_quad(text):
    with pytest.raises(ValueError):
        ipaddress.IPv4Address(text)   # the stdlib agrees it is not one
    with pytest.raises(ValueError, match="IPv4"):
        ip_int(text)


def test_ip_str_and_ip_int_round_trip_every_host_address_of_a_fabric():
    g = graph.build(spec.load("mini-cross-campus"))
    for host in graph.hosts(g):
        for port in graph.host_ports(g, host):
            assert ip_str(ip_int(port["ip"])) == port["ip"]


def test_prefix_int_gives_network_and_length():
    net = ipaddress.IPv4Network("10.1.0.0/16")
    assert prefix_int("10.1.0.0/16") == (int(net.network_address), 16)
    assert prefix_int("10.0.0.5") == (int(ipaddress.IPv4Address("10.0.0.5")), 32)


def test_prefix_int_refuses_host_bits_below_the_length():
    with pytest.raises(ValueError):
        prefix_int("10.1.0.1/16")


def test_every_planned_prefix_reads_back_as_the_plan_built_it():
    g = graph.build(spec.load("mini-cross-campus"))
    plan = g.graph["plan"]
    for plane in range(2):
        network, length = prefix_int(plan.plane_prefix(plane))
        assert ip_str(network) + f"/{length}" == plan.plane_prefix(plane)


def test_interface_names_are_node_dash_eth_port():
    assert graph.intf_name("h3", 1) == "h3-eth1"
    assert graph.intf_name("p0l12", 7) == "p0l12-eth7"
