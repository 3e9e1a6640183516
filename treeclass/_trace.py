"""Key-and-type paths. (Placeholder until the leafwise/trace issue lands.)"""

from __future__ import annotations

from typing import Any

__all__ = ["tree_flatten_with_trace", "tree_leaves_with_trace", "tree_map_with_trace"]


def tree_flatten_with_trace(tree: Any, *, is_leaf: Any = None) -> Any:
    raise NotImplementedError


def tree_leaves_with_trace(tree: Any, *, is_leaf: Any = None) -> Any:
    raise NotImplementedError


def tree_map_with_trace(func: Any, tree: Any, *rest: Any, is_leaf: Any = None) -> Any:
    raise NotImplementedError
