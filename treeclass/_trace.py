"""Key-and-type paths ("traces"): where a leaf sits, by key and by the types on the way.

The keys come from one keyed flatten; the node types depend only on the tree definition,
so they are read off the treedef once and cached per treedef.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
from jax.tree_util import PyTreeDef

from ._util import add_leaf_note, check_callable, path_str

Trace = tuple[tuple[Any, ...], tuple[type, ...]]

_tree_flatten_with_path = jax.tree_util.tree_flatten_with_path


def _walk_node_types(treedef: PyTreeDef) -> tuple[tuple[type, ...], ...]:
    """The types of the nodes between the root of `treedef` (not a leaf) and each leaf."""
    out: list[tuple[type, ...]] = []

    def visit(node: PyTreeDef, below_root: tuple[type, ...]) -> None:
        count = node.num_leaves
        if node.num_nodes == count + 1:  # every child is a leaf: skip building them
            out.extend([below_root] * count)
            return
        for child in node.children():
            if child.num_nodes == 1:  # a leaf, or None / an empty container (no leaf)
                if child.num_leaves:
                    out.append(below_root)
            elif child.num_leaves:
                visit(child, (*below_root, child.node_data()[0]))

    visit(treedef, ())
    return tuple(out)


# a cache only (thread-safe, bounded); equal treedefs have equal node types
_cached_node_types = functools.lru_cache(maxsize=256)(_walk_node_types)


def _node_types(treedef: PyTreeDef) -> tuple[tuple[type, ...], ...]:
    try:
        return _cached_node_types(treedef)
    except Exception:  # aux data that cannot be hashed or compared (arrays, say)
        return _walk_node_types(treedef)


def _flatten_with_path_stopping(
    tree: object, is_leaf: Callable[[Any], bool] | None, is_trace_leaf: Callable[[Trace], bool]
) -> tuple[list, Any]:
    """`tree_flatten_with_path` where `is_trace_leaf(trace)` can also make a node a leaf."""
    # JAX calls `is_leaf` on every node in depth-first pre-order, with its key path: the
    # stack holds the types of the nodes on the current path, the root's child first
    path_types: list[type] = []

    def stop(keys: tuple[Any, ...], node: object) -> bool:
        depth = len(keys)
        if depth:
            del path_types[depth - 1 :]
            path_types.append(type(node))
        if is_leaf is not None and is_leaf(node):
            return True
        return bool(is_trace_leaf((keys, tuple(path_types))))

    return _tree_flatten_with_path(tree, is_leaf=stop, is_leaf_takes_path=True)


def tree_flatten_with_trace(
    tree: object,
    *,
    is_leaf: Callable[[Any], bool] | None = None,
    is_trace_leaf: Callable[[Trace], bool] | None = None,
) -> tuple[list[tuple[Trace, Any]], PyTreeDef]:
    """Flatten `tree` into `(trace, leaf)` pairs and its tree definition.

    A trace is `(keys, types)`, as in PyTreeClass v0.4: the leaf's JAX key path, and the
    type of the node each prefix `keys[: i + 1]` leads to, ending with the leaf's own type
    (a leaf at the root: `((), ())`). Leaves come in `tree_flatten` order.

    **Arguments**

    - `tree`: any pytree.
    - `is_leaf`: as in `jax.tree_util`.
    - `is_trace_leaf`: called with the trace of every node (a Python call per node); the
      descent stops where it returns True (`lambda t: len(t[0]) == 2` stops at depth 2).

    **Returns**

    `(traced_leaves, treedef)`: a list of `((keys, types), leaf)` and the `PyTreeDef`.

    ```python
    import treeclass as tc

    [((keys, types), leaf)], treedef = tc.tree_flatten_with_trace({"a": [1.0]})
    assert len(keys) == 2 and types == (list, float) and leaf == 1.0
    ```
    """
    check_callable(is_leaf, "tree_flatten_with_trace", "is_leaf", optional=True)
    check_callable(is_trace_leaf, "tree_flatten_with_trace", "is_trace_leaf", optional=True)
    if is_trace_leaf is None:
        pairs, treedef = _tree_flatten_with_path(tree, is_leaf=is_leaf)
    else:
        pairs, treedef = _flatten_with_path_stopping(tree, is_leaf, is_trace_leaf)
    if treedef.num_nodes == 1:  # a leaf at the root (or no leaf at all)
        return [(((), ()), leaf) for _, leaf in pairs], treedef
    # strict=True would cost a keyword parse per call; the lengths agree by construction
    types = _node_types(treedef)
    return [((k, (*t, type(leaf))), leaf) for (k, leaf), t in zip(pairs, types)], treedef


def tree_leaves_with_trace(
    tree: object,
    *,
    is_leaf: Callable[[Any], bool] | None = None,
    is_trace_leaf: Callable[[Trace], bool] | None = None,
) -> list[tuple[Trace, Any]]:
    """The `(trace, leaf)` pairs of `tree`, as `tree_flatten_with_trace` gives them.

    **Arguments**

    - `tree`, `is_leaf`, `is_trace_leaf`: as for `tree_flatten_with_trace`.

    **Returns**

    A list of `((keys, types), leaf)`, in `jax.tree_util.tree_leaves` order.

    ```python
    import treeclass as tc

    [((keys, types), leaf)] = tc.tree_leaves_with_trace((1,))
    assert types == (int,) and leaf == 1
    ```
    """
    return tree_flatten_with_trace(tree, is_leaf=is_leaf, is_trace_leaf=is_trace_leaf)[0]


def tree_map_with_trace(
    func: Callable[..., Any],
    tree: object,
    *rest: object,
    is_leaf: Callable[[Any], bool] | None = None,
    is_trace_leaf: Callable[[Trace], bool] | None = None,
) -> Any:
    """`tree_map_with_path` with the trace `(keys, types)` of `tree_flatten_with_trace`
    ("inside a `Dropout`" is `Dropout in trace[1]`); `func`'s errors name the leaf.

    **Arguments**

    - `func`: called as `func(trace, leaf, *rest_leaves)` for every leaf.
    - `tree`: the pytree that fixes the structure.
    - `*rest`: pytrees with the structure of `tree` (or with `tree` as a prefix).
    - `is_leaf`, `is_trace_leaf`: as for `tree_flatten_with_trace`; where the descent
      stops, `func` gets the whole node, and `rest` trees the subtree at the same place.

    **Returns**

    A tree of `tree`'s structure holding the results of `func`.

    ```python
    import treeclass as tc

    tree = {"keep": (1.0, 2.0), "drop": [3.0]}
    out = tc.tree_map_with_trace(lambda t, x: 0.0 if list in t[1] else x, tree)
    assert out == {"keep": (1.0, 2.0), "drop": [0.0]}
    ```
    """
    check_callable(func, "tree_map_with_trace", "func", " of (trace, leaf, *rest)")
    traced, treedef = tree_flatten_with_trace(tree, is_leaf=is_leaf, is_trace_leaf=is_trace_leaf)
    columns = [treedef.flatten_up_to(other) for other in rest]
    out: list[Any] = []
    try:
        if columns:
            for (trace, leaf), *others in zip(traced, *columns, strict=True):
                out.append(func(trace, leaf, *others))
        else:  # one tree, the common call: no zip and no unpacking per leaf
            for trace, leaf in traced:
                out.append(func(trace, leaf))
    except Exception as error:
        (keys, _), leaf = traced[len(out)]
        name = getattr(func, "__name__", type(func).__name__)
        where = f"`{path_str(tree, keys)}` ({type(leaf).__name__})"
        add_leaf_note(error, f"raised by `{name}` at the leaf {where}")
        raise
    return treedef.unflatten(out)
