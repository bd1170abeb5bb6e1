"""The table interpreter now lives in the package (hpnlab.controller.oftable); this shim keeps
the tests' ``from oftable import ...`` working."""
from hpnlab.controller.oftable import *  # noqa: F403
from hpnlab.controller.oftable import Ambiguous, FabricTables, Walk, valley_free_reachable  # noqa: F401
