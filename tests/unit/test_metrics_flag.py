"""`hpnlab emulate/run --metrics [ADDR:PORT]`: the controller flags it turns into, and one line for bad input."""
from __future__ import annotations

import argparse

import pytest

from hpnlab.cli import cmd_web
from hpnlab.fabric.errors import UserError


def _args(argv: list[str], controller: str = "hpnlab") -> argparse.Namespace:
    p = argparse.ArgumentParser()
    cmd_web.add_web_args(p)
    return argparse.Namespace(**vars(p.parse_args(argv)), controller=controller)


def test_metrics_without_an_address_serve_on_loopback_at_the_default_port():
    flags, port = cmd_web.web_controller_args(_args(["--metrics"]))
    assert flags == ["--metrics-port", str(cmd_web.METRICS_DEFAULT_PORT), "--metrics-listen", "127.0.0.1"]
    assert port == cmd_web.METRICS_DEFAULT_PORT


def test_metrics_at_an_address_and_port_serve_there_and_say_where():
    flags, port = cmd_web.web_controller_args(_args(["--metrics", "0.0.0.0:9400"]))
    assert flags == ["--metrics-port", "9400", "--metrics-listen", "0.0.0.0"] and port == 9400
    assert cmd_web.metrics_line(flags, port) is not None and "http://0.0.0.0:9400/metrics" in str(
        cmd_web.metrics_line(flags, port))


def test_the_web_view_alone_takes_a_free_loopback_port_and_prints_no_metrics_line():
    flags, port = cmd_web.web_controller_args(_args(["--web"]))
    assert flags == ["--metrics-port", str(port)] and port and cmd_web.metrics_line(flags, port) is None


def test_with_metrics_and_the_web_view_the_view_reads_the_metrics_port_given():
    assert cmd_web.web_controller_args(_args(["--web", "--metrics", ":9401"]))[1] == 9401


def test_neither_flag_serves_nothing():
    assert cmd_web.web_controller_args(_args([])) == ([], None)


@pytest.mark.parametrize(("argv", "controller", "needle"), [
    (["--metrics", "nowhere:9310"], "hpnlab", "--metrics: expected ADDR:PORT"),
    (["--metrics", "127.0.0.1:70000"], "hpnlab", "--metrics: expected ADDR:PORT"),
    (["--metrics", ":0"], "hpnlab", "--metrics: give a port"),
    (["--metrics"], "ref", "the ref controller has none"),
])
def test_a_bad_metrics_flag_is_one_line(argv, controller, needle):
    with pytest.raises(UserError, match=needle) as err:
        cmd_web.web_controller_args(_args(argv, controller))
    assert "\n" not in str(err.value)
