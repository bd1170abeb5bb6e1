"""The dry run in the app (controller/dryrun.py reports): switches are read back and nothing else is
sent (no flow, group or barrier; no LLDP rule, no gate: the wiring manager is off), until every expected
switch has answered."""
from __future__ import annotations

from . import dryrun, reconcile
from .shell import Shell


class DryRunManager:
    def __init__(self, app: Shell):
        self.app = app

    @staticmethod
    def sends(msg: reconcile.Message) -> bool:
        """In a dry run only the questions of what a switch holds go out: no flow, group or barrier."""
        return isinstance(msg, (reconcile.FlowStatsRequest, reconcile.GroupDescRequest))

    def report(self, final: bool = False) -> dict | None:
        """What the controller would change on each switch that has been read back (see
        controller/dryrun.py); None until every expected switch has answered, unless ``final``."""
        app = self.app
        held = {sw: app.reconciler.confirmed[sw] for sw in app.index.sw if sw in app.reconciler.confirmed}
        if not final and len(held) < len(app.index.sw):
            return None
        return dryrun.report(app.scenario.name, app.index.sw, held, app.reconciler.desired)
