"""Key-and-type paths ("traces"): where a leaf sits, by key and by the types on the way.

A trace is `(keys, types)`, as in PyTreeClass v0.4: `keys` is the leaf's JAX key path and
`types` the type of every node the path reaches, from the root's child down to the leaf
itself; the root's own type is not in it (the caller has the root). So `len(types) ==
len(keys)`, `types[i]` is the type of the node that `keys[: i + 1]` leads to, and a leaf
at the root has the trace `((), ())`.

How this stays cheap: the keys come from one `jax.tree_util.tree_flatten_with_path`. The
node types depend only on the tree definition, so they are read off the treedef (one walk
over its nodes, not one per leaf) and cached per treedef; flattening a tree of a layout
seen before costs the keyed flatten plus one tuple per leaf. Stopping the descent by trace
(`is_trace_leaf`) needs the trace of every node, not only of the leaves: that path asks
JAX to pass each node's key path to its `is_leaf` callback and keeps the types of the
nodes above the current one on a stack, so it costs a call per node.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
from jax.tree_util import PyTreeDef

from ._util import add_leaf_note, check_callable, path_str

__all__ = ["tree_flatten_with_trace", "tree_leaves_with_trace", "tree_map_with_trace"]

Trace = tuple[tuple[Any, ...], tuple[type, ...]]

_tree_flatten_with_path = jax.tree_util.tree_flatten_with_path
_ROOT_TRACE: Trace = ((), ())

_IS_TRACE_LEAF_JAX_MSG = (
    "`is_trace_leaf` needs JAX 0.6.2 or newer (it asks `tree_flatten_with_path` to pass "
    "key paths to `is_leaf`), but JAX {version} is installed. Upgrade JAX, or select the "
    "nodes by value with `is_leaf=` instead."
)


def _walk_node_types(treedef: PyTreeDef) -> tuple[tuple[type, ...], ...]:
    """For every leaf of `treedef`, the types of the nodes between the root and the leaf."""
    if treedef.num_nodes == 1:  # the tree is a leaf, or a node without children
        return ((),) * treedef.num_leaves
    out: list[tuple[type, ...]] = []
    append = out.append

    def visit(node: PyTreeDef, below_root: tuple[type, ...]) -> None:
        count = node.num_leaves
        if node.num_nodes == count + 1:  # every child is a leaf: skip building them
            out.extend([below_root] * count)
            return
        for child in node.children():
            if child.num_nodes == 1:  # a leaf, or None / an empty container (no leaf)
                if child.num_leaves:
                    append(below_root)
            elif child.num_leaves:
                visit(child, (*below_root, child.node_data()[0]))

    visit(treedef, ())
    return tuple(out)


# Bounded, and thread-safe as `functools.lru_cache` is; a cache only, never needed for
# correctness (treedefs whose aux data cannot be hashed or compared skip it). Treedef
# equality includes every node's type, so equal treedefs have equal node types.
_cached_node_types = functools.lru_cache(maxsize=256)(_walk_node_types)


def _node_types(treedef: PyTreeDef) -> tuple[tuple[type, ...], ...]:
    try:
        return _cached_node_types(treedef)
    except Exception:  # aux data that cannot be hashed or compared (arrays, say)
        return _walk_node_types(treedef)


def _traced_leaves(leaves_with_path: list, treedef: PyTreeDef) -> list[tuple[Trace, Any]]:
    if treedef.num_nodes == 1:  # a leaf at the root (or no leaf at all)
        return [(_ROOT_TRACE, leaf) for _, leaf in leaves_with_path]
    # strict=True would cost a keyword parse per call; the lengths agree by construction
    return [
        ((keys, (*types, type(leaf))), leaf)
        for (keys, leaf), types in zip(leaves_with_path, _node_types(treedef))  # noqa: B905
    ]


def _flatten_with_path_stopping(
    tree: object,
    is_leaf: Callable[[Any], bool] | None,
    is_trace_leaf: Callable[[Trace], bool],
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

    try:
        return _tree_flatten_with_path(tree, is_leaf=stop, is_leaf_takes_path=True)
    except TypeError as error:
        if "is_leaf_takes_path" not in str(error):
            raise
        raise TypeError(_IS_TRACE_LEAF_JAX_MSG.format(version=jax.__version__)) from None


def tree_flatten_with_trace(
    tree: object,
    *,
    is_leaf: Callable[[Any], bool] | None = None,
    is_trace_leaf: Callable[[Trace], bool] | None = None,
) -> tuple[list[tuple[Trace, Any]], PyTreeDef]:
    """Flatten `tree` into `(trace, leaf)` pairs and its tree definition.

    A trace is `(keys, types)`, as in PyTreeClass v0.4:

    - `keys`: the leaf's key path, the JAX key entries that
      `jax.tree_util.tree_flatten_with_path` gives (`GetAttrKey("weight")` for a field,
      `DictKey("a")`, `SequenceKey(0)`), so `jax.tree_util.keystr(keys)` spells it and
      `jax.tree_util.GetAttrKey("weight") in keys` tests for a name on the path;
    - `types`: the type of every node on the path below the root, ending with the leaf's
      own type: `types[i]` is the type of the node that `keys[: i + 1]` leads to. The
      root's type is not included, so `len(types) == len(keys)`, and a leaf at the root
      has the trace `((), ())`. `Dropout in types` asks "is this leaf inside a Dropout?".

    Leaves come in `jax.tree_util.tree_flatten` order; works on any pytree.

    **Arguments**

    - `tree`: any pytree.
    - `is_leaf`: as in `jax.tree_util`: nodes for which it returns True are leaves.
    - `is_trace_leaf`: called with the trace of every node (the root's is `((), ())`);
      a node for which it returns True is a leaf, so the descent stops there (e.g.
      `lambda trace: len(trace[0]) == 2` stops at depth 2). Needs JAX 0.6.2 or newer,
      and costs a Python call per node.

    **Returns**

    `(traced_leaves, treedef)`: a list of `((keys, types), leaf)` and the `PyTreeDef`
    (whose leaves are the nodes where `is_leaf` or `is_trace_leaf` stopped).

    ```python
    import jax.numpy as jnp
    import treeclass as tc
    from jax.tree_util import DictKey, SequenceKey

    traced, treedef = tc.tree_flatten_with_trace({"a": [1.0, jnp.zeros(2)]})
    (keys, types), leaf = traced[0]
    assert keys == (DictKey("a"), SequenceKey(0)) and types == (list, float)
    stopped, _ = tc.tree_flatten_with_trace({"a": [1.0, 2.0]},
                                            is_trace_leaf=lambda t: list in t[1])
    assert stopped == [(((DictKey("a"),), (list,)), [1.0, 2.0])]
    ```
    """
    check_callable(is_leaf, "tree_flatten_with_trace", "is_leaf", optional=True)
    check_callable(is_trace_leaf, "tree_flatten_with_trace", "is_trace_leaf", optional=True)
    if is_trace_leaf is None:
        leaves_with_path, treedef = _tree_flatten_with_path(tree, is_leaf=is_leaf)
    else:
        leaves_with_path, treedef = _flatten_with_path_stopping(tree, is_leaf, is_trace_leaf)
    return _traced_leaves(leaves_with_path, treedef), treedef


def tree_leaves_with_trace(
    tree: object,
    *,
    is_leaf: Callable[[Any], bool] | None = None,
    is_trace_leaf: Callable[[Trace], bool] | None = None,
) -> list[tuple[Trace, Any]]:
    """The `(trace, leaf)` pairs of `tree`; see `tree_flatten_with_trace`.

    **Arguments**

    - `tree`: any pytree.
    - `is_leaf`: as in `jax.tree_util`.
    - `is_trace_leaf`: a node whose trace makes it return True is a leaf.

    **Returns**

    A list of `((keys, types), leaf)`, in `jax.tree_util.tree_leaves` order.

    ```python
    import treeclass as tc

    [((keys, types), leaf)] = tc.tree_leaves_with_trace((1,))
    assert types == (int,) and leaf == 1
    assert tc.tree_leaves_with_trace(1.0) == [(((), ()), 1.0)]   # a leaf at the root
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
    """Map `func(trace, leaf, *rest_leaves)` over the leaves of `tree`.

    Like `jax.tree_util.tree_map_with_path`, but `func` gets the trace `(keys, types)`
    (see `tree_flatten_with_trace`), so it can act on where a leaf sits by the types on
    its path: "every leaf inside a `Dropout`" is `Dropout in trace[1]`. An error raised
    by `func` gets a note naming the leaf it was called on.

    **Arguments**

    - `func`: called as `func(trace, leaf, *rest_leaves)` for every leaf.
    - `tree`: the pytree that fixes the structure.
    - `*rest`: pytrees with the structure of `tree` (or with `tree` as a prefix).
    - `is_leaf`: as in `jax.tree_util`.
    - `is_trace_leaf`: a node whose trace makes it return True is a leaf: `func` gets
      the whole node, and `rest` trees the subtree at the same place.

    **Returns**

    A tree of `tree`'s structure holding the results of `func`.

    ```python
    import treeclass as tc

    tree = {"keep": (1.0, 2.0), "drop": [3.0]}
    out = tc.tree_map_with_trace(lambda t, x: 0.0 if list in t[1] else x, tree)
    assert out == {"keep": (1.0, 2.0), "drop": [0.0]}
    sizes = tc.tree_map_with_trace(lambda t, x: len(x), tree,
                                   is_trace_leaf=lambda t: len(t[0]) == 1)
    assert sizes == {"keep": 2, "drop": 1}
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
        _note_failed_leaf(error, func, traced[len(out)], tree)
        raise
    return treedef.unflatten(out)


def _note_failed_leaf(
    error: BaseException, func: object, traced_leaf: tuple[Trace, Any], root: object
) -> None:
    (keys, _), leaf = traced_leaf
    name = getattr(func, "__name__", type(func).__name__)
    add_leaf_note(
        error, f"raised by `{name}` at the leaf `{path_str(root, keys)}` ({type(leaf).__name__})"
    )
