"""``--pfc on|off`` on the commands that emulate (declared once in cli/args.py): the options' ``ports.pfc``,
applied as the scenario's ``emulation.lossless.pfc`` for the run; a wrong value is one line."""
from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from hpnlab.cli import args as cli_args
from hpnlab.cli.args import emulation_options
from hpnlab.cli.main import build_parser
from hpnlab.fabric.emulation.harness import Emulation
from hpnlab.fabric.emulation.options import EmulationOptions, OptionsError, PortOptions
from hpnlab.fabric.scenario import spec


def test_on_and_off_become_the_options_pfc_setting():
    parser = build_parser()
    assert emulation_options(parser.parse_args(["emulate", "mini-hpn", "--pfc", "on"])).ports.pfc is True
    assert emulation_options(parser.parse_args(["run", "mini-hpn", "--pfc", "off"])).ports.pfc is False


def test_without_the_flag_the_scenario_decides():
    assert emulation_options(build_parser().parse_args(["emulate", "mini-hpn"])).ports.pfc is None


def test_the_option_sets_the_scenarios_pfc_for_the_run():
    scenario = spec.load("mini-hpn")
    on = Emulation(scenario, EmulationOptions(ports=PortOptions(pfc=True)), log=None)
    assert on.scenario.emulation.lossless.pfc is True and on.builder.scenario is on.scenario
    assert Emulation(scenario, EmulationOptions(), log=None).scenario is scenario


def test_the_option_is_written_with_the_others_and_read_back():
    options = EmulationOptions(ports=PortOptions(pfc=True))
    assert options.as_dict()["ports"]["pfc"] is True
    assert EmulationOptions.from_dict(options.as_dict()) == options


def test_a_pfc_option_other_than_a_bool_is_one_line():
    with pytest.raises(OptionsError, match="pfc must be on"):
        EmulationOptions(ports=PortOptions(pfc="yes"))  # type: ignore[arg-type]


def test_a_comma_list_gives_each_setting_once_in_order():
    assert cli_args.pfc_values("on,off,on") == (True, False)


@pytest.mark.parametrize("bad", ["maybe", "", ","])
def test_a_value_other_than_on_or_off_is_refused(bad):
    with pytest.raises(argparse.ArgumentTypeError):
        cli_args.pfc_values(bad) if "," in bad or not bad else cli_args.pfc_value(bad)


@pytest.mark.parametrize("command", ["run", "emulate", "demo", "fidelity"])
def test_every_command_that_emulates_takes_the_flag(command):
    parser = build_parser()
    several = command in ("fidelity", "run")          # they take on,off (run: for its comparisons)
    args = parser.parse_args([command, "mini-hpn", "--pfc", "on,off" if several else "on"])
    assert args.pfc == ((True, False) if several else True)


def test_a_wrong_value_on_the_command_line_is_one_usage_line():
    r = subprocess.run([sys.executable, "-m", "hpnlab.cli", "run", "mini-hpn", "--pfc", "sometimes"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "--pfc takes on or off" in r.stderr and "Traceback" not in r.stderr


def test_run_takes_on_comma_off_for_its_comparisons_and_only_for_them():
    parser = build_parser()
    assert parser.parse_args(["run", "mini-hpn", "--compare", "ecn", "--pfc", "on,off"]).pfc == (True, False)
    done = subprocess.run([sys.executable, "-m", "hpnlab.cli", "run", "mini-hpn", "--pfc", "on,off"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "hpnlab: --pfc on,off runs a comparison both ways (add --compare ecn or --compare routing); "
        "a run takes --pfc on or --pfc off"]
