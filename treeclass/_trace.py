"""Key-and-type paths ("traces"): where a leaf sits, by key and by the types above it.

A trace is `(keys, types)`: `keys` is the leaf's JAX key path, and `types` the type of
every node along it, root first and leaf last, so `len(types) == len(keys) + 1` and
`keys[i]` is a key of a node of type `types[i]`.

How this stays cheap: the keys come from one `jax.tree_util.tree_flatten_with_path`. The
node types depend only on the tree definition, so they are read off the treedef (one walk
over its nodes, not one per leaf) and cached per treedef; flattening a tree of a layout
seen before costs the keyed flatten plus one tuple per leaf.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax

from ._util import add_leaf_note

__all__ = ["tree_flatten_with_trace", "tree_leaves_with_trace", "tree_map_with_trace"]

Trace = tuple[tuple[Any, ...], tuple[type, ...]]

_tree_flatten_with_path = jax.tree_util.tree_flatten_with_path
_keystr = jax.tree_util.keystr


def _walk_node_types(treedef: Any) -> tuple[tuple[type, ...], ...]:
    """For every leaf of `treedef`, in order, the types of the nodes above it (root first)."""
    if treedef.num_nodes == 1:  # the tree is a leaf, or a node without children
        return ((),) * treedef.num_leaves
    out: list[tuple[type, ...]] = []
    append = out.append

    def visit(node: Any, above: tuple[type, ...]) -> None:
        above = (*above, node.node_data()[0])
        count = node.num_leaves
        if node.num_nodes == count + 1:  # every child is a leaf: skip building them
            out.extend([above] * count)
            return
        for child in node.children():
            if child.num_nodes == 1:  # a leaf, or None / an empty container (no leaf)
                if child.num_leaves:
                    append(above)
            elif child.num_leaves:
                visit(child, above)

    visit(treedef, ())
    return tuple(out)


# Bounded, and thread-safe as `functools.lru_cache` is; a cache only, never needed for
# correctness (treedefs whose aux data cannot be hashed or compared skip it). Treedef
# equality includes every node's type, so equal treedefs have equal node types.
_cached_node_types = functools.lru_cache(maxsize=256)(_walk_node_types)


def _node_types(treedef: Any) -> tuple[tuple[type, ...], ...]:
    try:
        return _cached_node_types(treedef)
    except Exception:  # aux data that cannot be hashed or compared (arrays, say)
        return _walk_node_types(treedef)


def tree_flatten_with_trace(
    tree: Any, *, is_leaf: Callable[[Any], bool] | None = None
) -> tuple[list[tuple[Trace, Any]], Any]:
    """Flatten `tree` into `(trace, leaf)` pairs and its tree definition.

    A trace is `(keys, types)`: the leaf's key path (JAX key entries, as in
    `jax.tree_util.tree_flatten_with_path`) and the type of every node along it, from
    the root to the leaf itself, so `len(types) == len(keys) + 1`. Leaves come in
    `jax.tree_util.tree_flatten` order; works on any pytree.

    **Arguments**

    - `tree`: any pytree.
    - `is_leaf`: as in `jax.tree_util`: nodes for which it returns True are leaves.

    **Returns**

    `(traced_leaves, treedef)`: a list of `((keys, types), leaf)` and the `PyTreeDef`.

    ```python
    import jax.numpy as jnp
    import treeclass as tc

    traced, treedef = tc.tree_flatten_with_trace({"a": [1.0, jnp.zeros(2)]})
    (keys, types), leaf = traced[1]
    assert types[:2] == (dict, list) and len(keys) == 2
    ```
    """
    leaves_with_path, treedef = _tree_flatten_with_path(tree, is_leaf=is_leaf)
    above = _node_types(treedef)
    traced = [
        ((keys, types + (type(leaf),)), leaf)
        for (keys, leaf), types in zip(leaves_with_path, above, strict=True)
    ]
    return traced, treedef


def tree_leaves_with_trace(
    tree: Any, *, is_leaf: Callable[[Any], bool] | None = None
) -> list[tuple[Trace, Any]]:
    """The `(trace, leaf)` pairs of `tree`; see `tree_flatten_with_trace`.

    ```python
    import treeclass as tc

    [((keys, types), leaf)] = tc.tree_leaves_with_trace((1,))
    assert types == (tuple, int) and leaf == 1
    ```
    """
    return tree_flatten_with_trace(tree, is_leaf=is_leaf)[0]


def tree_map_with_trace(
    func: Callable[..., Any],
    tree: Any,
    *rest: Any,
    is_leaf: Callable[[Any], bool] | None = None,
) -> Any:
    """Map `func(trace, leaf, *rest_leaves)` over the leaves of `tree`.

    Like `jax.tree_util.tree_map_with_path`, but `func` gets the trace `(keys, types)`
    (see `tree_flatten_with_trace`), so it can act on where a leaf sits by the types
    above it: "every leaf under a `Dropout`". An error raised by `func` gets a note naming
    the leaf it was called on.

    **Arguments**

    - `func`: called as `func(trace, leaf, *rest_leaves)` for every leaf.
    - `tree`: the pytree that fixes the structure.
    - `*rest`: pytrees with the structure of `tree` (or with `tree` as a prefix).
    - `is_leaf`: as in `jax.tree_util`.

    **Returns**

    A tree of `tree`'s structure holding the results of `func`.

    ```python
    import treeclass as tc

    tree = {"keep": (1.0, 2.0), "drop": [3.0]}
    out = tc.tree_map_with_trace(lambda t, x: 0.0 if list in t[1] else x, tree)
    assert out == {"keep": (1.0, 2.0), "drop": [0.0]}
    ```
    """
    traced, treedef = tree_flatten_with_trace(tree, is_leaf=is_leaf)
    if rest:
        columns = [treedef.flatten_up_to(other) for other in rest]
        rows: Any = zip(traced, *columns, strict=True)
        out = []
        try:
            for (trace, leaf), *others in rows:
                out.append(func(trace, leaf, *others))
        except Exception as error:
            _note_failed_leaf(error, func, traced[len(out)][0])
            raise
    else:
        out = []
        try:
            for trace, leaf in traced:
                out.append(func(trace, leaf))
        except Exception as error:
            _note_failed_leaf(error, func, traced[len(out)][0])
            raise
    return treedef.unflatten(out)


def _note_failed_leaf(error: BaseException, func: Any, trace: Trace) -> None:
    keys, types = trace
    name = getattr(func, "__name__", type(func).__name__)
    add_leaf_note(
        error, f"raised by `{name}` at the leaf `tree{_keystr(keys)}` ({types[-1].__name__})"
    )
