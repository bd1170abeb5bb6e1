"""`mn --custom` entry for multi-plane HPN fabrics.

    sudo .venv/bin/mn --custom topologies/hpn.py --topo hpn,planes=2,hosts_per_segment=4 \
        --switch ovs,datapath=user,protocols=OpenFlow13 --controller remote --link tc

``hpn`` starts from the ``mini-hpn`` preset and overrides any scenario field given
(``planes=2``, ``rails=2``, ``segments_per_pod=2``, ``emulation.host_mbps=5``...);
``hpn,small-hpn,...`` starts from another preset instead. Hosts get one interface per NIC
port (``hN-ethI``) with the planned address and plane prefix; switches carry their dpids and
port numbers. Prefer ``sudo hpnlab emulate`` (controller, shaping, ECN, cleanup).
"""
import os
import sys

# `mn --custom` exec()s this file without __file__: the code object still knows its file name
_HERE = globals().get("__file__") or sys._getframe(0).f_code.co_filename
sys.path.insert(0, os.path.dirname(os.path.abspath(_HERE)))
import _hpnlab_import  # noqa: E402,F401  (hpnlab.* from an install or this checkout)

from hpnlab.fabric.emulation.mn import topo_from  # noqa: E402


def hpn(preset="mini-hpn", **fields):
    fields.setdefault("kind", "hpn")
    return topo_from(preset, **fields)


topos = {"hpn": hpn}
