"""Stand-ins for the emulation and the plan that ``compare_ecn.run_comparison`` is given, for tests
that hand it their own ``run`` (no emulation is built): it asks the emulation only for its graph and
the plan only for copies, its jobs and its dict. Import with
``from support.compare_stand_ins import FakeEmu, FakePlan``."""
from __future__ import annotations

from typing import Any


class FakeEmu:
    graph = None


class FakePlan:
    def replace(self, **kw: Any) -> FakePlan:
        return self

    def jobs_on(self, g: Any) -> dict:
        return {}

    def as_dict(self) -> dict:
        return {}
