"""What can go wrong with a run once it is under way (a user's own mistake is ``hpnlab.fabric.errors.UserError``)."""
from __future__ import annotations


class EmulationError(RuntimeError):
    """The emulation could not be brought up as asked (switches not connecting, hosts unreachable)."""


class ControllerLost(EmulationError):
    """The controller process died and the run was asked to stop then (``on_loss="stop"``)."""
