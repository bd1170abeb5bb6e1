"""`mn --custom` entry for three-tier k-ary fat-trees.

    sudo .venv/bin/mn --custom topologies/fattree.py --topo fattree,k=4 \
        --switch ovs,datapath=user,protocols=OpenFlow13 --controller remote --link tc

``fattree,k=K`` builds the ``fat-tree`` preset with ``k`` pods (k^3/4 hosts); any other
scenario field may be overridden too. Prefer ``sudo hpnlab emulate fat-tree-4``.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fabric.mn import topo_from  # noqa: E402


def fattree(k=4, **fields):
    return topo_from("fat-tree", k=k, **fields)


topos = {"fattree": fattree, "fat-tree": fattree}
