"""Leafwise operators. (Placeholder until the leafwise issue lands.)"""

from __future__ import annotations

__all__ = ["leafwise"]


def leafwise(cls: type) -> type:
    raise NotImplementedError(
        "leafwise=True is accepted but leafwise operators are not implemented yet"
    )


def bcmap(func, broadcast_to=None, *, is_leaf=None):
    raise NotImplementedError("bcmap is not built yet")
