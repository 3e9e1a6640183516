"""The `.at[...]` indexer: select parts of any pytree and get a new tree back.

How it stays fast: selectors are compiled once, when indexed (`_selectors.py`). An
operation then walks the tree from the root. A plain name or index is looked up directly
(a TreeClass child is `node.__dict__[name]`, a dict child `node[key]`, a sequence child
`node[i]`), so a chain of them costs what the path is deep, not what the tree is big. Only
the nodes on the path to a change are rebuilt, and a TreeClass is rebuilt as a shallow
copy whose `__dict__` entry is overwritten: its layout (names, static values) is unchanged,
so the copy stays valid without running `__init__` or re-flattening. Every other selector
(masks, classes, predicates, globs, `...`) visits each node below its level once, and an
unchanged subtree is returned as the same object, never rebuilt.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.tree_util import DictKey, GetAttrKey, SequenceKey

from ._selectors import (
    DESCEND,
    DICT,
    GENERIC,
    LEAF,
    LIST,
    MASK_MISMATCH_MSG,
    MATCH,
    NAMEDTUPLE,
    NOTHING,
    SELF,
    TREECLASS,
    TUPLE,
    IndexMatcher,
    MaskMatcher,
    Matcher,
    NameMatcher,
    child_by_entry,
    compile_selector,
    is_frozen,
    missing_key_error,
    node_kind,
    open_node,
    rebuild,
)

__all__ = ["AtIndexer", "at"]

_MISSING: Any = object()

ONLY_BLOCKED_MSG = (
    "The selection {selection} reaches no leaves: it only reaches {what}. Static fields "
    "(`tc.field(static=True)`) are part of the tree definition, and frozen values "
    "(`tc.freeze`) are nodes without children, so neither is a leaf. To edit frozen values, "
    "select them as leaves:\n"
    "    {selection}.apply(fn, is_leaf=tc.is_frozen)\n"
    "or unfreeze them first (`tc.unfreeze`)."
)
TRACED_MASK_GET_MSG = (
    "Cannot take `leaf[mask]` at {where}: the element mask is traced (inside `jax.jit`, "
    "`vmap` or `grad`), and the result's shape would depend on its values. Keep the leaf's "
    "shape by filling unselected elements instead:\n"
    "    before: tree.at[mask].get()\n"
    "    after:  tree.at[mask].get(fill_value=0)   # jnp.where(mask, leaf, 0)"
)
SET_STRUCTURE_MSG = (
    "Cannot set {where}: the value's structure fits neither the selection there nor the "
    "whole tree. The value must be a leaf (broadcast to every selected leaf), a tree with "
    "the structure of the selected subtree (or a prefix of it), or a tree with the "
    "structure of the whole tree.\n    selected: {selected}\n    value:    {value}\n"
    "To put a tree of another structure in place of a leaf, use `.apply(lambda _: new)`; "
    "in place of a subtree, `.apply(lambda _: new, is_leaf=lambda x: x is old_subtree)`."
)
EMPTY_REDUCE_MSG = (
    "`reduce` over an empty selection {selection} needs an initializer: "
    "`.reduce(fn, initializer=...)`."
)
CALL_NEEDS_NAME_MSG = (
    "Only a method name can be called: `tree.at['method'](*args, **kwargs)` (optionally "
    "after names and indices, `tree.at['child']['method']()`), got `.at{selection}(...)`."
)
NOT_CALLABLE_MSG = (
    "{where} is not callable (it is a `{type}`), so `.at[{name!r}](...)` cannot call it. Use "
    "`.at[{name!r}].get()`, `.set(value)` or `.apply(fn)` to read or change it."
)
NO_METHOD_MSG = "{where} has no method {name!r}{hint}"
ITERATION_MSG = (
    "An `AtIndexer` cannot be iterated: index it (`tree.at['name']`) and call an operation "
    "(`.get()`, `.set(v)`, `.apply(fn)`, `.reduce(fn)`, `.scan(fn, state)`)."
)


def _path_str(root: Any, path: tuple[Any, ...]) -> str:
    """A key path as text, prefixed by the root's class name (or `tree` for builtins)."""
    cls = type(root)
    prefix = cls.__name__ if cls.__module__ != "builtins" else "tree"
    return prefix + jax.tree_util.keystr(path)


def _short_repr(x: Any, limit: int = 40) -> str:
    if x is Ellipsis:
        return "..."
    if isinstance(x, type):
        return x.__name__
    text = repr(x)
    if "\n" in text:  # a multi-line repr (a mask tree): name its type only
        return f"<{type(x).__name__} mask>" if x is not None else "None"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _selection_str(root: Any, where: tuple[Any, ...]) -> str:
    cls = type(root)
    prefix = cls.__name__ if cls.__module__ != "builtins" else "tree"
    return prefix + ".at" + "".join(f"[{_short_repr(s)}]" for s in where)


def _is_leaf_node(node: Any, is_leaf: Any) -> bool:
    kind = node_kind(node, is_leaf)
    return kind == LEAF or (kind == GENERIC and open_node(node, kind) is None)


def _and_masks(outer: Any, inner: Any) -> Any:
    if outer is None:
        return inner
    if inner is None:
        return outer
    return jnp.logical_and(outer, inner)


def _masked(mask: Any, new: Any, old: Any) -> Any:
    return jnp.where(mask, new, old)


def _take(x: Any, mask: Any, fill_value: Any, where: str) -> Any:
    """The selected elements of leaf `x`: `x[mask]`, or `jnp.where` when there is a fill."""
    if fill_value is not None:
        return jnp.where(mask, x, fill_value)
    if isinstance(mask, jax.core.Tracer):
        raise TypeError(TRACED_MASK_GET_MSG.format(where=where))
    if not isinstance(x, (jax.Array, np.ndarray)):
        x = jnp.asarray(x)
    return x[mask]


# -- the walker ----------------------------------------------------------------------------


class _Walker:
    """One operation's traversal: which nodes the selectors reach, and what the op does there."""

    __slots__ = ("root", "matchers", "n", "op", "is_leaf", "fills", "memo", "count", "blocked")

    def __init__(self, root: Any, matchers: tuple[Matcher, ...], op: _Op, is_leaf: Any):
        self.root = root
        self.matchers = matchers
        self.n = len(matchers)
        self.op = op
        self.is_leaf = is_leaf
        self.fills = op.fills
        self.memo: dict[Any, Any] = {}
        self.count = 0  # selected leaves: an empty selection of only frozen/static is an error
        self.blocked: list[tuple[tuple[Any, ...], str]] = []

    # helpers the matchers call back
    def where(self, path: tuple[Any, ...]) -> str:
        return _path_str(self.root, path)

    def missing(self, key: Any, node: Any, kind: int, opened: Any, path: tuple) -> Exception:
        return missing_key_error(key, node, kind, opened, self.where(path))

    def mask_error(self, path: tuple[Any, ...], tree_has: str, mask_has: str) -> Exception:
        extra = ""
        if "node" in self.memo.values():
            extra = (" (The mask does not fit the whole tree either, so it was matched "
                     "against the subtree selected before it.)")
        return ValueError(MASK_MISMATCH_MSG.format(
            where=self.where(path), tree_has=tree_has, mask_has=mask_has, extra=extra))

    def record_blocked(self, path: tuple[Any, ...], why: str) -> None:
        self.blocked.append((path, why))

    # the traversal
    def run(self, selection: Callable[[], str]) -> Any:
        out = self.walk(self.root, (), 0, None)
        if self.count == 0 and self.blocked:
            what = ", ".join(f"{self.where(p)} ({why})" for p, why in self.blocked[:8])
            if len(self.blocked) > 8:
                what += f" and {len(self.blocked) - 8} more"
            raise LookupError(ONLY_BLOCKED_MSG.format(selection=selection(), what=what))
        return out

    def walk(self, node: Any, path: tuple[Any, ...], i: int, emask: Any) -> Any:
        if i == self.n:
            before = self.count
            out = self.op.spot(self, node, path, emask)
            if self.count == before and jax.tree_util.tree_leaves(node, is_leaf=is_frozen):
                self.record_blocked(path, "frozen")
            return out
        matcher = self.matchers[i]
        if matcher.single_key and not self.fills:
            return self.walk_key(node, path, i, emask, matcher)
        return self.level(node, path, i, emask, matcher, matcher.initial(node, path, self))

    def walk_key(self, node: Any, path: tuple, i: int, emask: Any, matcher: Any) -> Any:
        # The fast path: look one child up by name or index, rebuild only this node.
        key = matcher.key
        kind = node_kind(node, self.is_leaf)
        if kind == TREECLASS:
            d = node.__dict__
            if type(key) is str and key in d and key not in type(node)._tc_static_names:
                child = d[key]
                new = self.walk(child, path + (GetAttrKey(key),), i + 1, emask)
                if new is child:
                    return node
                # same names, so the same layout: a cheap copy with one child replaced
                return node._tc_replace({key: new})
        elif kind == DICT:
            if key in node:
                child = node[key]
                new = self.walk(child, path + (DictKey(key),), i + 1, emask)
                if new is child:
                    return node
                out = dict(node)
                out[key] = new
                return out
        elif kind == LIST or kind == TUPLE:
            if type(key) is int:
                n = len(node)
                index = key + n if key < 0 else key
                if 0 <= index < n:
                    child = node[index]
                    new = self.walk(child, path + (SequenceKey(index),), i + 1, emask)
                    if new is child:
                        return node
                    out = list(node)
                    out[index] = new
                    return out if kind == LIST else tuple(out)
        elif kind == NAMEDTUPLE:
            fields = type(node)._fields
            index = -1
            if type(key) is str and key in fields:
                index = fields.index(key)
            elif type(key) is int and -len(fields) <= key < len(fields):
                index = key % len(fields)
            if index >= 0:
                child = node[index]
                new = self.walk(child, path + (GetAttrKey(fields[index]),), i + 1, emask)
                if new is child:
                    return node
                return node._replace(**{fields[index]: new})
        # anything else (a custom node, or a key that is missing: the general path raises)
        return self.level(node, path, i, emask, matcher, matcher.initial(node, path, self))

    def level(self, node: Any, path: tuple, i: int, emask: Any, matcher: Any, state: Any) -> Any:
        kind = node_kind(node, self.is_leaf)
        opened = None if kind == LEAF else open_node(node, kind)
        code, payload = matcher.enter(state, node, kind, opened, path, self)
        if code == SELF:
            return self.walk(node, path, i + 1, _and_masks(emask, payload))
        if code == NOTHING or opened is None:
            return self.unselected(node)
        entries, children, aux = opened
        fills = self.fills
        changed = False
        step = matcher.step
        for k, child in enumerate(children):
            entry = entries[k]
            child_path = path + (entry,)
            code, result = step(payload, k, entry, child, child_path)
            if code == MATCH:
                new = self.walk(child, child_path, i + 1, _and_masks(emask, result))
            elif code == DESCEND:
                new = self.level(child, child_path, i, emask, matcher, result)
            elif fills:
                new = self.unselected(child)
            else:
                continue
            if new is not child:
                children[k] = new  # `children` is a fresh list from open_node
                changed = True
        matcher.finish(payload, node, kind, opened, path, self)
        return rebuild(node, kind, aux, children) if changed else node

    def unselected(self, node: Any) -> Any:
        if not self.fills:
            return node
        fill = self.op.fill_value
        if node_kind(node, self.is_leaf) == LEAF:
            return fill
        return jax.tree_util.tree_map(lambda _: fill, node, is_leaf=self.is_leaf)

    def map_leaves(self, fn: Callable[[Any], Any], node: Any) -> Any:
        """`fn` over the leaves of a selected subtree (counting them)."""

        def counted(x: Any) -> Any:
            self.count += 1
            return fn(x)

        return jax.tree_util.tree_map(counted, node, is_leaf=self.is_leaf)


# -- operations ----------------------------------------------------------------------------


class _Op:
    """What happens at each selected node (a *spot*), given its element mask (or `None`)."""

    __slots__ = ()
    fills = False  # whether unselected leaves are replaced (only `get`)
    fill_value: Any = None

    def spot(self, walker: _Walker, node: Any, path: tuple, emask: Any) -> Any:
        raise NotImplementedError


class _Get(_Op):
    __slots__ = ("fill_value",)
    fills = True

    def __init__(self, fill_value: Any) -> None:
        self.fill_value = fill_value

    def spot(self, walker, node, path, emask):
        if emask is None:
            if _is_leaf_node(node, walker.is_leaf):
                walker.count += 1
            else:
                walker.count += len(jax.tree_util.tree_leaves(node, is_leaf=walker.is_leaf))
            return node
        fill, where = self.fill_value, walker.where(path)
        return walker.map_leaves(lambda x: _take(x, emask, fill, where), node)


class _Set(_Op):
    __slots__ = ("value", "mode")

    BROADCAST, ROOT, SPOT = range(3)

    def __init__(self, value: Any, root: Any, is_leaf: Any) -> None:
        self.value = value
        if value is None or _is_leaf_node(value, is_leaf):
            self.mode = self.BROADCAST
        else:
            same = (jax.tree_util.tree_structure(value, is_leaf=is_leaf)
                    == jax.tree_util.tree_structure(root, is_leaf=is_leaf))
            self.mode = self.ROOT if same else self.SPOT

    def spot(self, walker, node, path, emask):
        value = self.value
        if self.mode == self.BROADCAST:
            if _is_leaf_node(node, walker.is_leaf):
                walker.count += 1
                return value if emask is None else _masked(emask, value, node)
            if emask is None:
                return walker.map_leaves(lambda _: value, node)
            return walker.map_leaves(lambda x: _masked(emask, value, x), node)
        if self.mode == self.ROOT:
            return self._pairwise(walker, node, self._navigate(walker, value, path), emask, path)
        try:
            return self._pairwise(walker, node, value, emask, path)
        except ValueError:
            # not a prefix of the selected subtree: maybe a prefix of the whole tree
            return self._pairwise(walker, node, self._navigate(walker, value, path), emask, path)

    def _navigate(self, walker, value, path):
        for entry in path:
            if _is_leaf_node(value, walker.is_leaf):
                return value  # a prefix of the whole tree: this leaf covers the subtree
            found, value = child_by_entry(value, entry)
            if not found:
                raise self._structure_error(walker, path, walker.root, self.value)
        return value

    def _structure_error(self, walker, path, node, value):
        return ValueError(SET_STRUCTURE_MSG.format(
            where=walker.where(path),
            selected=jax.tree_util.tree_structure(node, is_leaf=walker.is_leaf),
            value=jax.tree_util.tree_structure(value, is_leaf=walker.is_leaf),
        ))

    def _pairwise(self, walker, node, value, emask, path):
        def put_subtree(v: Any, sub: Any) -> Any:
            if emask is None:
                return walker.map_leaves(lambda _: v, sub)
            return walker.map_leaves(lambda x: _masked(emask, v, x), sub)

        count = walker.count
        try:
            # `value` first: it may be a prefix of the selected subtree
            return jax.tree_util.tree_map(put_subtree, value, node, is_leaf=walker.is_leaf)
        except ValueError:
            walker.count = count
            raise self._structure_error(walker, path, node, self.value) from None


class _Apply(_Op):
    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn

    def spot(self, walker, node, path, emask):
        fn = self.fn
        if _is_leaf_node(node, walker.is_leaf):
            walker.count += 1
            return fn(node) if emask is None else _masked(emask, fn(node), node)
        if emask is None:
            return walker.map_leaves(fn, node)
        return walker.map_leaves(lambda x: _masked(emask, fn(x), x), node)


class _Collect(_Op):
    __slots__ = ("leaves",)

    def __init__(self) -> None:
        self.leaves: list[Any] = []

    def spot(self, walker, node, path, emask):
        if emask is None:
            found = jax.tree_util.tree_leaves(node, is_leaf=walker.is_leaf)
        else:
            where = walker.where(path)
            found = [_take(x, emask, None, where)
                     for x in jax.tree_util.tree_leaves(node, is_leaf=walker.is_leaf)]
        walker.count += len(found)
        self.leaves.extend(found)
        return node


class _Scan(_Op):
    __slots__ = ("fn", "state")

    def __init__(self, fn: Callable[[Any, Any], tuple[Any, Any]], state: Any) -> None:
        self.fn = fn
        self.state = state

    def _one(self, x: Any, emask: Any) -> Any:
        new, self.state = self.fn(x, self.state)
        return new if emask is None else _masked(emask, new, x)

    def spot(self, walker, node, path, emask):
        if _is_leaf_node(node, walker.is_leaf):
            walker.count += 1
            return self._one(node, emask)
        return walker.map_leaves(lambda x: self._one(x, emask), node)


class _Replace(_Op):
    """Put one given node at the (single) selected spot: used by method calls."""

    __slots__ = ("node",)

    def __init__(self, node: Any) -> None:
        self.node = node

    def spot(self, walker, node, path, emask):
        walker.count += 1
        return self.node


# -- the indexer -------------------------------------------------------------------------


_NO_FAST_PATH = object()


def _whole_mask_fast_path(tree: Any, mask: Any, op: _Op) -> Any:
    """`tree.at[mask].set/apply` for a mask with exactly the tree's structure.

    The most common mask (`tree > 0`, or one built with `tree_map`) lines up leaf for
    leaf, so one C-level flatten of each and a zip replace the general walk (which keeps
    paths for its error messages). Anything unusual (a prefix mask, a non-bool leaf, a
    selection of nothing) returns `_NO_FAST_PATH`, and the general walk reports it.
    """
    if type(op) is _Apply:
        fn = op.fn
    elif type(op) is _Set and op.mode == _Set.BROADCAST:
        value = op.value
        fn = lambda _: value
    else:
        return _NO_FAST_PATH
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    flags, mask_def = jax.tree_util.tree_flatten(mask)
    if mask_def != treedef:
        return _NO_FAST_PATH
    out = []
    selected = 0
    for leaf, flag in zip(leaves, flags):
        if flag is True or (type(flag) is np.bool_ and flag):
            out.append(fn(leaf))
        elif flag is False or type(flag) is np.bool_:
            out.append(leaf)
            continue
        elif isinstance(flag, (jax.Array, np.ndarray)) and flag.dtype == np.bool_:
            out.append(_masked(flag, fn(leaf), leaf))
        else:
            return _NO_FAST_PATH
        selected += 1
    if not selected:
        return _NO_FAST_PATH
    return jax.tree_util.tree_unflatten(treedef, out)


class AtIndexer:
    """Select parts of a pytree with `[...]`, then get, set, apply, reduce or scan them.

    `tree.at[...]` on a `TreeClass`, `tc.at(tree)[...]` (or `AtIndexer(tree)[...]`) on any
    pytree: dicts, lists, tuples, namedtuples, equinox modules, any registered node.
    Each `[...]` is one level of the key path; a tuple is a union at one level. Every
    operation returns a new tree and leaves the input untouched, even when it raises.

    **Selectors**

    - `"name"`: the attribute or dict key; `0`, `-1`: a sequence index (negative counts
      from the end); `...`: every child at this level (alone, the whole tree);
      `re.compile(p)`: children whose name fully matches `p`;
    - a boolean mask: a pytree with the tree's structure (or a prefix of it) holding
      bools or boolean arrays, e.g. `jax.tree_util.tree_map(lambda x: x > 0, tree)`. A
      bool selects (or not) the whole leaf or subtree; a boolean *array* selects elements
      of its leaf (`jnp.where` semantics for `set`/`apply`/`scan`, `leaf[mask]` for `get`
      and `reduce`). A mask used after path selectors is matched against the whole tree
      when it fits it, otherwise against each node selected so far. A tuple made only of
      bools/masks is one mask (for a tuple tree), not a union;
    - a class, e.g. `Linear`: every node below the current level that is an instance of
      it (leaves too: `jax.Array`), not looking inside a match;
    - `tc.where(fn)`: every node below for which `fn(path, node)` is true;
    - `tc.glob("layers.*.weight")`: nodes whose key path below matches the pattern;
    - a `tc.BaseKey` instance: children whose key entry it says it equals.

    Later selectors apply relative to each node selected before them:
    `model.at[Linear]["weight"]`.

    **Operations** (each accepts `is_leaf=`, treating more nodes as leaves)

    - `.get(fill_value=None)`: the same structure, unselected leaves replaced by
      `fill_value`;
    - `.set(value)`: `value` is a leaf (put at every selected leaf), a tree with the
      structure of the selected subtree (or a prefix of it), or a tree with the structure
      of the whole tree (values taken where selected);
    - `.apply(fn)`: `fn` applied to every selected leaf;
    - `.reduce(fn, initializer=...)`: `fn(accumulator, leaf)` folded over the selected
      leaves in flatten order;
    - `.scan(fn, state)`: `new_leaf, state = fn(leaf, state)` over the selected leaves;
      returns `(new_tree, final_state)`;
    - `tree.at["method"](*args, **kwargs)` (a `TreeClass`): runs the method on a copy in
      which every node may be mutated; returns `(return_value, new_tree)`. Nested:
      `tree.at["child"]["method"]()`.

    ```python
    import jax, jax.numpy as jnp
    import treeclass as tc

    tree = {"a": jnp.array([-1.0, 2.0]), "b": {"c": 3.0}}
    tree2 = tc.at(tree)["b"]["c"].set(30.0)
    assert tree2["b"]["c"] == 30.0 and tree["b"]["c"] == 3.0
    mask = jax.tree_util.tree_map(lambda x: x > 0, tree)
    assert tc.at(tree)[mask].apply(lambda x: x * 10)["a"].tolist() == [-1.0, 20.0]
    assert tc.at(tree)[...].reduce(lambda acc, x: acc + jnp.sum(x), initializer=0.0) == 4.0
    ```
    """

    __slots__ = ("tree", "where", "_matchers")

    def __init__(self, tree: Any, where: tuple[Any, ...] = ()) -> None:
        self.tree = tree
        self.where = tuple(where)
        matchers = []
        for i, selector in enumerate(self.where):
            upto = self.where[: i + 1]
            matchers.append(
                compile_selector(selector, lambda upto=upto: _selection_str(tree, upto)))
        self._matchers = tuple(matchers)

    def __getitem__(self, selector: Any) -> AtIndexer:
        new = object.__new__(AtIndexer)
        new.tree = self.tree
        new.where = self.where + (selector,)
        if type(selector) is str:  # the common case, without building an error context
            matcher: Matcher = NameMatcher(selector)
        elif type(selector) is int:
            matcher = IndexMatcher(selector)
        else:
            matcher = compile_selector(selector, lambda: _selection_str(new.tree, new.where))
        new._matchers = self._matchers + (matcher,)
        return new

    def __iter__(self):
        raise TypeError(ITERATION_MSG)

    def __repr__(self) -> str:
        return f"AtIndexer({_selection_str(self.tree, self.where)})"

    def _run(self, op: _Op, is_leaf: Any) -> Any:
        if is_leaf is None and len(self._matchers) == 1 and type(self._matchers[0]) is MaskMatcher:
            out = _whole_mask_fast_path(self.tree, self._matchers[0].mask, op)
            if out is not _NO_FAST_PATH:
                return out
        walker = _Walker(self.tree, self._matchers, op, is_leaf)
        return walker.run(lambda: _selection_str(self.tree, self.where))

    def get(self, fill_value: Any = None, *, is_leaf: Callable[[Any], bool] | None = None) -> Any:
        """The tree with unselected leaves replaced by `fill_value`.

        **Arguments**

        - `fill_value`: what unselected leaves become (`None` by default). Under an
          element mask, `None` gives `leaf[mask]`; any other value gives
          `jnp.where(mask, leaf, fill_value)` (which also works with traced masks).
        - `is_leaf`: treat nodes for which it returns `True` as leaves.

        **Returns**

        A tree of the input's structure (with `fill_value` leaves).

        ```python
        import treeclass as tc

        assert tc.at({"a": 1, "b": 2})["a"].get() == {"a": 1, "b": None}
        ```
        """
        return self._run(_Get(fill_value), is_leaf)

    def set(self, value: Any, *, is_leaf: Callable[[Any], bool] | None = None) -> Any:
        """The tree with the selected leaves replaced by `value`.

        **Arguments**

        - `value`: a leaf, put at every selected leaf; a tree with the structure of each
          selected subtree (or a prefix of it, broadcast); or a tree with the structure of
          the whole tree, read where selected. Under an element mask the result is
          `jnp.where(mask, value, leaf)`.
        - `is_leaf`: treat nodes for which it returns `True` as leaves.

        **Returns**

        The new tree.

        ```python
        import treeclass as tc

        assert tc.at({"a": 1, "b": 2})["a"].set(10) == {"a": 10, "b": 2}
        assert tc.at([[1, 2], [3]])[0].set([8, 9]) == [[8, 9], [3]]
        ```
        """
        return self._run(_Set(value, self.tree, is_leaf), is_leaf)

    def apply(self, fn: Callable[[Any], Any], *,
              is_leaf: Callable[[Any], bool] | None = None) -> Any:
        """The tree with `fn` applied to every selected leaf.

        **Arguments**

        - `fn`: a function of one leaf. Under an element mask the result is
          `jnp.where(mask, fn(leaf), leaf)`.
        - `is_leaf`: treat nodes for which it returns `True` as leaves.

        **Returns**

        The new tree.

        ```python
        import treeclass as tc

        assert tc.at({"a": 1, "b": 2})["b"].apply(lambda x: x * 10) == {"a": 1, "b": 20}
        ```
        """
        return self._run(_Apply(fn), is_leaf)

    def reduce(self, fn: Callable[[Any, Any], Any], *, initializer: Any = _MISSING,
               is_leaf: Callable[[Any], bool] | None = None) -> Any:
        """Fold `fn(accumulator, leaf)` over the selected leaves, in flatten order.

        **Arguments**

        - `fn`: a function of the accumulator and one leaf.
        - `initializer`: the first accumulator; without it the first selected leaf is.
        - `is_leaf`: treat nodes for which it returns `True` as leaves.

        **Returns**

        The final accumulator.

        ```python
        import treeclass as tc

        tree = {"a": 1, "b": 2, "c": 3}
        assert tc.at(tree)["a", "c"].reduce(lambda acc, x: acc + x) == 4
        ```
        """
        collect = _Collect()
        self._run(collect, is_leaf)
        if initializer is _MISSING:
            if not collect.leaves:
                raise TypeError(EMPTY_REDUCE_MSG.format(
                    selection=_selection_str(self.tree, self.where)))
            return functools.reduce(fn, collect.leaves)
        return functools.reduce(fn, collect.leaves, initializer)

    def scan(self, fn: Callable[[Any, Any], tuple[Any, Any]], state: Any, *,
             is_leaf: Callable[[Any], bool] | None = None) -> tuple[Any, Any]:
        """Apply `fn` to the selected leaves in flatten order, threading a state.

        **Arguments**

        - `fn`: `(leaf, state) -> (new_leaf, new_state)`.
        - `state`: the initial state.
        - `is_leaf`: treat nodes for which it returns `True` as leaves.

        **Returns**

        `(new_tree, final_state)`.

        ```python
        import treeclass as tc

        tree = {"a": 1, "b": 2}
        def count(leaf, n):
            return leaf * 10, n + 1
        assert tc.at(tree)[...].scan(count, 0) == ({"a": 10, "b": 20}, 2)
        ```
        """
        scan = _Scan(fn, state)
        tree = self._run(scan, is_leaf)
        return tree, scan.state

    def __call__(self, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        """Call a method on a mutable copy: `tree.at["method"](*a, **k)` -> `(value, new_tree)`.

        The copy's nodes may be mutated by the method (set, delete or add attributes);
        they are immutable again once it returns or raises, and the input is untouched.
        Earlier names and indices reach a nested node: `tree.at["child"]["method"]()`.

        ```python
        import treeclass as tc

        class Counter(tc.TreeClass):
            count: int = 0

            def increment(self, by):
                self.count += by
                return self.count

        value, counter = Counter().at["increment"](2)
        assert value == 2 and counter.count == 2
        ```
        """
        where = self.where
        if not where or type(where[-1]) is not str:
            raise TypeError(CALL_NEEDS_NAME_MSG.format(
                selection="".join(f"[{_short_repr(s)}]" for s in where)))
        for selector in where[:-1]:
            if type(selector) not in (str, int):
                raise TypeError(CALL_NEEDS_NAME_MSG.format(
                    selection="".join(f"[{_short_repr(s)}]" for s in where)))
        name = where[-1]
        root = self.tree
        if hasattr(root, "_tc_unsealed_copy"):
            tree = root._tc_unsealed_copy()
            try:
                parent, path = _navigate(tree, where[:-1])
                value = _method(tree, parent, path, name)(*args, **kwargs)
            except BaseException:
                try:
                    tree._tc_reseal()
                except Exception:  # the method's own error is the one to report
                    pass
                raise
            tree._tc_reseal()
            return value, tree
        parent, path = _navigate(root, where[:-1])
        if not hasattr(parent, "_tc_unsealed_copy"):
            return _method(root, parent, path, name)(*args, **kwargs), root
        local = parent._tc_unsealed_copy()
        try:
            value = _method(root, local, path, name)(*args, **kwargs)
        except BaseException:
            try:
                local._tc_reseal()
            except Exception:
                pass
            raise
        local._tc_reseal()
        if not path:
            return value, local
        walker = _Walker(root, self._matchers[:-1], _Replace(local), None)
        return value, walker.run(lambda: _selection_str(root, where[:-1]))


def _navigate(tree: Any, keys: tuple[Any, ...]) -> tuple[Any, tuple[Any, ...]]:
    """The node reached by a chain of names and indices, and its key path."""
    node, path = tree, ()
    for key in keys:
        kind = node_kind(node)
        opened = open_node(node, kind)
        matcher = NameMatcher(key) if type(key) is str else IndexMatcher(key)
        probe = _Walker(tree, (), _Op(), None)
        code, state = matcher.enter(None, node, kind, opened, path, probe)
        found = None
        for k, (entry, child) in enumerate(zip(opened[0], opened[1], strict=True)):
            if matcher.step(state, k, entry, child, path + (entry,))[0] == MATCH:
                found = (entry, child)
                break
        matcher.finish(state, node, kind, opened, path, probe)
        path = path + (found[0],)
        node = found[1]
    return node, path


def _method(root: Any, parent: Any, path: tuple[Any, ...], name: str) -> Callable[..., Any]:
    where = _path_str(root, path)
    try:
        method = getattr(parent, name)
    except AttributeError:
        names = [n for n in dir(parent) if not n.startswith("_") and callable(
            getattr(type(parent), n, None))]
        close = difflib.get_close_matches(name, names, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else "."
        raise AttributeError(NO_METHOD_MSG.format(where=where, name=name, hint=hint)) from None
    if not callable(method):
        raise TypeError(NOT_CALLABLE_MSG.format(
            where=f"{where}.{name}", type=type(method).__name__, name=name))
    return method


def at(tree: Any) -> AtIndexer:
    """The `.at[...]` indexer of any pytree: `tc.at(tree)[...]`; see `AtIndexer`.

    **Arguments**

    - `tree`: any pytree (a `TreeClass` also has the `tree.at` property).

    **Returns**

    An `AtIndexer` selecting the whole tree, ready to be indexed.

    ```python
    import treeclass as tc

    assert tc.at({"a": [1, 2]})["a"][-1].set(5) == {"a": [1, 5]}
    ```
    """
    return AtIndexer(tree)
