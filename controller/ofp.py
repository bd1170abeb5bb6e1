"""Import shim: the app's os-ken names, taken from os-ken (Ryu's maintained fork) or, where only Ryu
is installed, from Ryu.

os-ken is what hpnlab installs and what the launcher (``python -m hpnlab.controller``) runs the app
on (Ryu does not install on Python >= 3.10 without patches). The app reads its configuration from the
file the launcher hands it (controller/conf.py), so it is started by the launcher, not by
``ryu-manager``.
"""
try:  # os-ken
    from os_ken.base import app_manager
    from os_ken.controller import ofp_event
    from os_ken.controller.handler import CONFIG_DISPATCHER, DEAD_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
    from os_ken.lib import hub
    from os_ken.lib.packet import arp, ether_types, ethernet, ipv4, lldp, packet, tcp, udp
    from os_ken.ofproto import ofproto_v1_3

    BaseApp = app_manager.OSKenApp
    FRAMEWORK = "os-ken"
except ImportError:  # Ryu
    from ryu.base import app_manager
    from ryu.controller import ofp_event
    from ryu.controller.handler import CONFIG_DISPATCHER, DEAD_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
    from ryu.lib import hub
    from ryu.lib.packet import arp, ether_types, ethernet, ipv4, lldp, packet, tcp, udp
    from ryu.ofproto import ofproto_v1_3

    BaseApp = app_manager.RyuApp
    FRAMEWORK = "ryu"

__all__ = [
    "CONFIG_DISPATCHER",
    "DEAD_DISPATCHER",
    "FRAMEWORK",
    "MAIN_DISPATCHER",
    "BaseApp",
    "app_manager",
    "arp",
    "ether_types",
    "ethernet",
    "hub",
    "ipv4",
    "lldp",
    "ofp_event",
    "ofproto_v1_3",
    "packet",
    "set_ev_cls",
    "tcp",
    "udp",
]
