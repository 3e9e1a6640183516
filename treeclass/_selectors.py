"""Selectors for `.at[...]`. (Placeholder until the indexer issue lands.)"""

from __future__ import annotations

from typing import Any

__all__ = ["BaseKey", "where", "glob"]


class BaseKey:
    """Base class for user-defined key matchers (placeholder)."""

    def __eq__(self, entry: Any) -> bool:
        raise NotImplementedError


def where(fn: Any) -> Any:
    raise NotImplementedError("the .at indexer is not built yet")


def glob(pattern: str) -> Any:
    raise NotImplementedError("the .at indexer is not built yet")
