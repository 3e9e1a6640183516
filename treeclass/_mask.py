"""Freezing and masking. (Placeholder until the masking issue lands.)"""

from __future__ import annotations

from typing import Any

__all__ = ["freeze", "unfreeze", "is_frozen", "is_nondiff", "tree_mask", "tree_unmask"]


def is_frozen(x: Any) -> bool:
    return False


def freeze(x: Any) -> Any:
    raise NotImplementedError("masking is not built yet")


def unfreeze(x: Any) -> Any:
    return x


def is_nondiff(x: Any) -> bool:
    raise NotImplementedError("masking is not built yet")


def tree_mask(tree: Any, cond: Any = None, *, is_leaf: Any = None) -> Any:
    raise NotImplementedError("masking is not built yet")


def tree_unmask(tree: Any, cond: Any = None) -> Any:
    raise NotImplementedError("masking is not built yet")
