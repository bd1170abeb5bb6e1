"""Counting what a pure function is asked while it still does its work: ``spy`` replaces
``owner.name`` (through pytest's ``monkeypatch``, undone after the test) with a wrapper that keeps
``record(*args, **kwargs)`` of every call and then calls the real one. Import with
``from support.spy import spy``."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any


def spy(monkeypatch: Any, owner: Any, name: str, record: Callable[..., Any]) -> list[Any]:
    """The list that gets ``record(*args, **kwargs)`` of every call of ``owner.name`` from now on."""
    real = getattr(owner, name)
    calls: list[Any] = []

    def recording(*args: Any, **kwargs: Any) -> Any:
        calls.append(record(*args, **kwargs))
        return real(*args, **kwargs)
    monkeypatch.setattr(owner, name, recording)
    return calls
