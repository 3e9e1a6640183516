"""Printing trees. (Minimal first version; the printing issue fills this module in.)"""

from __future__ import annotations

from typing import Any

__all__ = ["tree_repr", "tree_str"]


def _fields_shown(tree: Any) -> list[tuple[str, Any]]:
    hidden = {f.name for f in getattr(type(tree), "_tc_fields", {}).values() if not f.repr}
    return [(k, v) for k, v in vars(tree).items() if k not in hidden]


def tree_repr(tree: Any) -> str:
    if hasattr(type(tree), "_tc_fields"):
        body = ", ".join(f"{k}={tree_repr(v)}" for k, v in _fields_shown(tree))
        return f"{type(tree).__name__}({body})"
    return repr(tree)


def tree_str(tree: Any) -> str:
    if hasattr(type(tree), "_tc_fields"):
        body = ", ".join(f"{k}={tree_str(v)}" for k, v in _fields_shown(tree))
        return f"{type(tree).__name__}({body})"
    return str(tree)


def _not_built(*args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError("printing is not built yet")


tree_diagram = tree_summary = tree_graph = tree_mermaid = tree_repr_with_trace = _not_built
