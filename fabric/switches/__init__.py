"""Simulated OpenFlow 1.3 switches for a scenario (``hpnlab switches``): a controller measured at full scale
on one machine, and what it installed read back for the proofs. Pure decisions in ``tables``, the
encoding in ``wire`` (os-ken), one switch message by message in ``endpoint``, the sockets in ``server``."""
