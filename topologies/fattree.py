"""`mn --custom` entry for three-tier k-ary fat-trees.

    sudo .venv/bin/mn --custom topologies/fattree.py --topo fattree,k=4 \
        --switch ovs,datapath=user,protocols=OpenFlow13 --controller remote --link tc

``fattree,k=K`` builds the ``fat-tree`` preset with ``k`` pods (k^3/4 hosts); any other
scenario field may be overridden too. Prefer ``sudo hpnlab emulate fat-tree-4``.
"""
import os
import sys

# `mn --custom` exec()s this file without __file__: the code object still knows its file name
_HERE = globals().get("__file__") or sys._getframe(0).f_code.co_filename
sys.path.insert(0, os.path.dirname(os.path.abspath(_HERE)))
import _hpnlab_import  # noqa: E402,F401  (hpnlab.* from an install or this checkout)

from hpnlab.fabric.emulation.mn import topo_from  # noqa: E402


def fattree(k=4, **fields):
    return topo_from("fat-tree", k=k, **fields)


topos = {"fattree": fattree, "fat-tree": fattree}
