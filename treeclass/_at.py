"""The `.at[...]` indexer. (Placeholder until the indexer issue lands.)"""

from __future__ import annotations

from typing import Any

__all__ = ["AtIndexer", "at"]


class AtIndexer:
    def __init__(self, tree: Any, where: tuple[Any, ...] = ()) -> None:
        self.tree = tree
        self.where = where

    def __getitem__(self, where: Any) -> AtIndexer:
        raise NotImplementedError("the .at indexer is not built yet")


def at(tree: Any) -> AtIndexer:
    return AtIndexer(tree)
