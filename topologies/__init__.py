"""Scenario presets (``*.yaml``) and the ``mn --custom`` entry files; installed as ``hpnlab.topologies``."""
