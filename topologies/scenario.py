"""`mn --custom` entry for any scenario: a preset name or a YAML file, plus field overrides.

    sudo .venv/bin/mn --custom topologies/scenario.py --topo scenario,mini-cross-campus \
        --switch ovs,datapath=user,protocols=OpenFlow13 --controller remote --link tc
    sudo .venv/bin/mn --custom topologies/scenario.py --topo scenario,path/to/my.yaml,planes=4

Prefer ``sudo hpnlab emulate SCENARIO`` (controller, shaping, ECN stage, cleanup).
"""
import os
import sys

# `mn --custom` exec()s this file without __file__: the code object still knows its file name
_HERE = globals().get("__file__") or sys._getframe(0).f_code.co_filename
sys.path.insert(0, os.path.dirname(os.path.abspath(_HERE)))
import _hpnlab_import  # noqa: E402,F401  (hpnlab.* from an install or this checkout)

from hpnlab.fabric.emulation.mn import topo_from  # noqa: E402


def scenario(name="mini-hpn", **fields):
    return topo_from(str(name), **fields)


topos = {"scenario": scenario}
