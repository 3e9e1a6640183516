"""A selection as a value: what a chain of `.at` selectors reaches in a tree, found once.

`select(tree, matchers)` is the one walker of the package: each matcher (`_selectors`)
gives its verdict on the nodes of its level, from the root down, and the `Selection` keeps
a *trail* of only the nodes on the way to the selected spots (each with its row and
opening, so that an edit rebuilds just those), the spots (a node, its key path, its
element mask) and what blocked the way (static fields, wrapped values). The `.at`
operations hand `Selection.rebuild` what to put at each spot; `mask()` puts flags there
(a stack's row gathers one per block), which `flags()` / `paths()` read per leaf in
flatten order for `tc.optim`, the sharding rules and a partial `tc.load`. A chain of
names and indices costs what the path is deep; a mask of the tree's exact structure is
read leaf by leaf (`aligned_mask`); the flags that structure alone decides are cached.
"""

from __future__ import annotations

import abc
import functools
import re
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ._selectors import (
    EACH,
    NO,
    ONE,
    STATIC,
    YES,
    EllipsisMatcher,
    EntryMatcher,
    GlobMatcher,
    IndexMatcher,
    Matcher,
    NameMatcher,
    SliceMatcher,
    TypeMatcher,
    UnionMatcher,
    Walk,
)
from ._structure import LEAF, NodeKind, Opened, is_wrapper, node_kind, row_of, wrapper_of
from ._util import add_leaf_note

ONLY_BLOCKED_MSG = (
    "The selection {selection} reaches no leaves: it only reaches {what}. Static fields "
    "(`tc.field(static=True)`) are part of the tree definition, and wrapped values (frozen "
    "by `tc.freeze`, or of another wrapper kind) are nodes without children, so neither is "
    "a leaf. To edit wrapped values, select them as leaves:\n"
    "    {selection}.apply(fn, is_leaf=tc.is_masked)\n"
    "or unwrap them first (`tc.unfreeze`, `tc.tree_unmask`)."
)
FROZEN_IN_THE_WAY_MSG = (
    "The selection {selection} reaches no leaves: the pattern goes on inside {what}. A wrapped "
    "value (frozen by `tc.freeze`, or of another wrapper kind) is a node without children, so "
    "nothing inside it can be selected, not even with `is_leaf=tc.is_masked` (that selects "
    "the wrapped value whole). Unwrap it first (`tc.unfreeze`, or `tc.tree_unmask` for a "
    "whole tree), or select the wrapped value itself with a pattern that ends at it."
)
ELEMENT_MASK_SHAPE_MSG = (
    "The element mask at {where} has shape {mask_shape}, but the leaf there has shape "
    "{leaf_shape}: an element mask selects elements of its leaf, so it must have the leaf's "
    "shape (or broadcast to it without changing it)."
)


class Spot(NamedTuple):
    """A selected node: its key path, and the element mask over its leaves (or `None`)."""

    node: Any
    path: tuple[Any, ...]
    emask: Any


class _Node(NamedTuple):
    """A node on the way to spots: its row, its opening, and the trails below it, by
    child position."""

    row: NodeKind
    node: Any
    path: tuple[Any, ...]
    opened: Opened
    subs: list[tuple[int, Any]]


class _Hops(NamedTuple):
    """Nodes left each through the one child a name or index selects: `(row, node, path,
    entry, child)` per hop, from the top, then the trail below the last child."""

    hops: list[tuple[Any, ...]]
    sub: Any


class _Static(NamedTuple):
    """A static field named last in a `set` or `apply`: a spot in the node's layout."""

    row: NodeKind
    node: Any
    path: tuple[Any, ...]
    name: str


# made by the C-level tuple constructor (a NamedTuple's own `__new__` runs in Python)
_spot: Callable[[tuple], Spot] = functools.partial(tuple.__new__, Spot)
_hops: Callable[[tuple], _Hops] = functools.partial(tuple.__new__, _Hops)


# the classes of arrays seen as mask flags and leaves (JAX's, tracers, NumPy's): a speed
# cache of `isinstance(x, (jax.Array, np.ndarray))`, which no class ever stops passing
ARRAY_CLASSES: set[type] = {np.ndarray}
_BOOL = np.dtype(bool)

_UNWALKED: Any = object()  # `trail` before the walk has run


class Selection(Walk):
    """What a chain of matchers (one per level, as `.at[a][b]`) selects in `tree`, and the
    walk they report to: see the module docstring. With `statics`, a name given last may
    be a static field (for `set` and `apply`); with `opens`, a node is opened even where a
    name or index picks one child (for `get`, which fills the others: a stack then
    rebuilds from its own blocks)."""

    __slots__ = ("matchers", "n", "opens", "selection", "_trail")

    def __init__(
        self,
        tree: Any,
        matchers: tuple[Matcher, ...],
        is_leaf: Callable[[Any], bool] | None = None,
        selection: Callable[[], str] = lambda: "the selection",
        statics: bool = False,
        opens: bool = False,
    ) -> None:
        super().__init__(tree, is_leaf)
        if statics and matchers:
            self.static_ok = matchers[-1]
        self.opens = opens
        self.matchers = matchers
        self.n = len(matchers)
        self.selection = selection
        self._trail: Any = _UNWALKED

    @property
    def trail(self) -> Any:
        """The nodes on the way to the spots (the walk runs on first use)."""
        if self._trail is _UNWALKED:
            self._trail = self.walk(self.tree, (), 0, None)
        return self._trail

    # -- the walk
    def walk(self, node: Any, path: tuple[Any, ...], i: int, emask: Any) -> Any:
        hops: list[tuple[Any, ...]] | None = None
        n = self.n
        plain = self.is_leaf is None and not self.opens
        while i < n:
            matcher = self.matchers[i]
            found = None
            if plain and matcher.one_key:  # a name or an index, the hot path: `match` inlined
                row = row_of(node)
                found = row.child(node, matcher.key)  # type: ignore[attr-defined]
            if found is None:
                verdict = matcher.match(self, matcher.start, node, path)
                if verdict[0] != ONE or self.opens:
                    sub = self.level(node, path, i, emask, matcher, verdict)
                    break
                found = verdict[1]
                row = found[2]
            # one child, the node left unopened
            entry, child = found[0], found[1]
            if hops is None:
                hops = []
            hops.append((row, node, path, entry, child))
            node, path, i = child, path + (entry,), i + 1
        else:
            sub = _spot((node, path, emask))
        return sub if hops is None or sub is None else _hops((hops, sub))

    def level(
        self, node: Any, path: tuple, i: int, emask: Any, matcher: Matcher, verdict: tuple
    ) -> Any:
        """The trail below `node`, given `matcher`'s verdict on it (`None`: nothing)."""
        code, payload = verdict
        if code == NO:
            return None
        if code == YES:
            return self.walk(node, path, i + 1, and_masks(emask, payload))
        row = row_of(node, self.is_leaf)
        if code == ONE:  # a node opened all the same (`opens`)
            opened = row.open(node)
            assert opened is not None  # the row found a child in it
            k = opened.entries.index(payload[0])
            sub = self.walk(opened.children[k], path + (payload[0],), i + 1, emask)
            return None if sub is None else _Node(row, node, path, opened, [(k, sub)])
        if code == STATIC:
            return _Static(row, node, path + (jax.tree_util.GetAttrKey(payload),), payload)
        if code == EACH:
            opened = row.open(node)
            if opened is None:
                return None
            states: Any = None
        else:  # ZIP
            opened, states = payload
        entries = opened.entries
        match = matcher.match
        # more selectors follow a matcher that sees into wrapped values: a wrapped match stops
        stops = matcher.sees_into_frozen and i + 1 < self.n
        subs = []
        for k, child in enumerate(opened.children):
            child_path = path + (entries[k],)
            try:
                code, result = match(
                    self, payload if states is None else states[k], child, child_path
                )
            except Exception as error:
                add_leaf_note(
                    error,
                    f"raised while matching {matcher!r} at {self.where(child_path)} "
                    f"(in {self.selection()})",
                )
                raise
            if code == NO:
                continue
            if code == YES:
                wrapper = wrapper_of(child) if stops else None
                if wrapper is not None:  # nothing below a wrapped value is selectable
                    self.record_blocked(child_path, wrapper.role)
                    continue
                sub = self.walk(child, child_path, i + 1, and_masks(emask, result))
            else:
                sub = self.level(child, child_path, i, emask, matcher, (code, result))
            if sub is not None:
                subs.append((k, sub))
        return _Node(row, node, path, opened, subs) if subs else None

    # -- reading it
    def unmatched(self) -> Matcher | None:
        """The first selector that names something (a glob, a regex, a `BaseKey`) and
        selected nothing."""
        for matcher in self.matchers:
            for member in matcher.members():
                if member.names_something and member not in self.hits:
                    return member
        return None

    def check(self, count: int, spot_blocked: list[tuple[tuple[Any, ...], str, bool]]) -> None:
        """Raise for a selection that names nothing, or reaches only static fields and
        wrapped values (`count`: the leaves the operation reached)."""
        self.trail  # noqa: B018  # the walk fills `blocked` and `hits`
        blocked = self.blocked + spot_blocked if spot_blocked else self.blocked
        if not blocked and not any(matcher.naming for matcher in self.matchers):
            return
        unmatched = self.unmatched()
        # Selected spots holding only wrapped values do not explain a glob, regex or
        # BaseKey that matched no key at all: the typo is said first.
        if count == 0 and blocked and (unmatched is None or any(b[2] for b in blocked)):
            what = ", ".join(f"{self.where(p)} ({why})" for p, why, _ in blocked[:8])
            if len(blocked) > 8:
                what += f" and {len(blocked) - 8} more"
            if all(why != "a static field" and by_matcher for _, why, by_matcher in blocked):
                raise LookupError(
                    FROZEN_IN_THE_WAY_MSG.format(selection=self.selection(), what=what)
                )
            raise LookupError(ONLY_BLOCKED_MSG.format(selection=self.selection(), what=what))
        if unmatched is not None:
            raise unmatched.no_match_error(self, self.selection())

    def rebuild(
        self,
        spot: Callable[[Spot], Any],
        static: Callable[[_Static], Any] | None = None,
        *,
        fills: bool = False,
        fill: Any = None,
        where: Callable[[tuple], str] | None = None,
    ) -> Any:
        """The tree with `spot(s)` put at each spot `s` (in the order of the trail: flatten
        order, a stack's blocks one after another), `static(s)` at a static spot, and, with
        `fills`, every unselected leaf replaced by it. Only the nodes on the trail are
        rebuilt, each by its row."""
        where = where or self.where
        t = self.trail
        is_leaf = self.is_leaf

        def unselected(node: Any) -> Any:
            if not fills:
                return node
            if node_kind(node, is_leaf) == LEAF:
                return fill
            return jax.tree_util.tree_map(lambda _: fill, node, is_leaf=is_leaf)

        def build(t: Any) -> Any:
            cls = type(t)
            if cls is Spot:
                return spot(t)
            if cls is _Hops:
                new = build(t.sub)
                for row, node, path, entry, child in reversed(t.hops):
                    if not fills:
                        new = (
                            node
                            if new is child
                            else row.replace(node, entry, child, new, path, where)
                        )
                        continue
                    # (a `get` opens such nodes as it selects: a stack keeps its own blocks)
                    opened = row.open(node)
                    children = [unselected(c) for c in opened.children]
                    children[opened.entries.index(entry)] = new
                    new = row.rebuild(node, opened.aux, children, True, path, where)
                return new
            if cls is _Static:
                assert static is not None  # only ops that edit static fields allow them
                return static(t)
            children = list(t.opened.children)
            changed = False
            if fills:
                picked = {k for k, _ in t.subs}
                for k, child in enumerate(children):
                    if k not in picked:
                        children[k] = unselected(child)
                        changed = changed or children[k] is not child
            for k, sub in t.subs:
                new = build(sub)
                if new is not children[k]:
                    children[k] = new
                    changed = True
            if not changed:
                return t.node
            return t.row.rebuild(t.node, t.opened.aux, children, fills, t.path, where)

        return unselected(self.tree) if t is None else build(t)

    def mask(self) -> Any:
        """The selection as a boolean tree: `True` at every selected leaf (an element mask
        broadcast to its leaf), `False` elsewhere; nodes without children stay as they are,
        and a stack gathers one flag per block along its block axis."""
        key, flags = _kept(self)
        if flags is not None:
            return jax.tree_util.tree_structure(self.tree, is_leaf=self.is_leaf).unflatten(flags)
        return self.made_mask(key)

    def made_mask(self, key: Any) -> Any:
        """`mask()`, computed (and kept under `key`, when that is not `None`)."""
        count = 0
        spot_blocked: list[tuple[tuple[Any, ...], str, bool]] = []
        is_leaf = self.is_leaf

        def flag(s: Spot) -> Any:
            nonlocal count
            emask = s.emask
            pairs, treedef = jax.tree_util.tree_flatten_with_path(s.node, is_leaf=is_leaf)
            if not pairs:
                note_blocked(s, spot_blocked)
                return s.node
            count += len(pairs)
            if emask is None:
                return treedef.unflatten([True] * len(pairs))
            flags = []
            for p, x in pairs:
                check_element_mask(emask, x, functools.partial(self.where, s.path + p))
                flags.append(jnp.broadcast_to(emask, shape_of(x)))
            return treedef.unflatten(flags)

        out = self.rebuild(flag, fills=True, fill=False)
        self.check(count, spot_blocked)
        if key is not None:
            flags = tuple(jax.tree_util.tree_leaves(out, is_leaf=is_leaf))
            if all(f is True or f is False for f in flags):
                _remember(key, flags)
        return out

    def flags(self) -> list[Any]:
        """One flag per leaf of the tree (split by `is_leaf`), in flatten order: `False`,
        `True`, or a bool array (an element mask, or one flag per block of a stack)."""
        key, found = _kept(self)
        if found is not None:
            return list(found)
        return jax.tree_util.tree_leaves(self.made_mask(key), is_leaf=self.is_leaf)

    def paths(self) -> list[tuple[Any, ...]]:
        """The key paths of the leaves selected in whole or in part, in flatten order."""
        pairs = jax.tree_util.tree_flatten_with_path(self.tree, is_leaf=self.is_leaf)[0]
        return [path for (path, _), f in zip(pairs, self.flags(), strict=True) if any_true(f)]


# -- the cache of structural selections -----------------------------------------------------
# What names, indices, slices, `...`, regexes, globs and plain classes select follows from the
# tree's structure and its leaves' types (a wrapped value's: the type inside), so their flags
# are kept per (structure, leaf types, selectors, `is_leaf`). Masks, predicates, `BaseKey`s and
# `def_rule` selectors read values or run user code: never kept; nor is a selection that
# gives a leaf an array. (A stack's count of blocks is part of its structure.)

_CACHE: dict[Any, tuple[bool, ...]] = {}
_CACHE_SIZE = 256
_CACHE_LOCK = threading.Lock()  # lookups are single dict reads; writes evict under the lock


def _remember(key: Any, flags: tuple[bool, ...]) -> None:
    with _CACHE_LOCK:
        _CACHE[key] = flags
        while len(_CACHE) > _CACHE_SIZE:
            del _CACHE[next(iter(_CACHE))]  # the oldest entry first


_PLAIN_CHECKS: tuple[Any, ...] = (type.__instancecheck__, abc.ABCMeta.__instancecheck__)


def _selector_key(matcher: Matcher) -> Any:
    """What a structural matcher selects by, hashable; `None` for any other matcher."""
    if type(matcher) is NameMatcher or type(matcher) is IndexMatcher:
        return (type(matcher), type(matcher.key), matcher.key)
    if type(matcher) is EllipsisMatcher:
        return EllipsisMatcher
    if type(matcher) is SliceMatcher:
        part = matcher.slice
        return (SliceMatcher, part.start, part.stop, part.step)
    if type(matcher) is EntryMatcher and type(matcher.selector) is re.Pattern:
        return (EntryMatcher, matcher.selector)
    if type(matcher) is GlobMatcher:
        return (GlobMatcher, matcher.glob.pattern)
    if type(matcher) is TypeMatcher and type(matcher.cls).__instancecheck__ in _PLAIN_CHECKS:
        return (TypeMatcher, matcher.cls)  # `isinstance` that the type decides (no `Protocol`)
    if type(matcher) is UnionMatcher:
        members = tuple(_selector_key(m) for m in matcher.members_)
        return None if None in members else (UnionMatcher, members)
    return None


def _leaf_type(leaf: object) -> Any:
    wrapper = wrapper_of(leaf)
    return type(leaf) if wrapper is None else (type(leaf), type(wrapper.unwrap(leaf)))


def _kept(found: Selection) -> tuple[Any, tuple[bool, ...] | None]:
    """`(key, flags kept under it)` for a structural selection (`flags` `None` when none
    are kept yet), the key being `(structure, leaf types, selectors, is_leaf)`; `(None,
    None)` for any other selection.

    Wrapped values count as leaves here, typed with the value inside (a class selector
    sees into them), whatever their own `==` says.
    """
    selectors = tuple(_selector_key(m) for m in found.matchers)
    if None in selectors:
        return None, None
    is_leaf = found.is_leaf
    stop = is_wrapper if is_leaf is None else lambda x: is_leaf(x) or is_wrapper(x)
    leaves, treedef = jax.tree_util.tree_flatten(found.tree, is_leaf=stop)
    # an ABC's virtual subclasses may change: the token changes with them
    key = (treedef, tuple(map(_leaf_type, leaves)), selectors, is_leaf, abc.get_cache_token())
    try:  # the lookup hashes the key once (a structure's hash walks all of it)
        return key, _CACHE.get(key)
    except TypeError:  # a part that does not hash (an `is_leaf` defining `==`): no cache
        return None, None


def note_blocked(s: Spot, blocked: list[tuple[tuple[Any, ...], str, bool]]) -> None:
    """A spot that reached no leaf: if it holds wrapped values, say so by their role."""
    wrapped = jax.tree_util.tree_leaves(s.node, is_leaf=is_wrapper)
    if wrapped:
        blocked.append((s.path, getattr(wrapper_of(wrapped[0]), "role", "wrapped"), False))


select = Selection  # the one walker: `select(tree, matchers, ...)` is the selection


def aligned_mask(tree: Any, mask: Any) -> tuple[list[Any], Any, list[Any], list[Any]] | None:
    """A mask of exactly the tree's structure, read leaf by leaf: `(leaves, treedef, flags,
    spots)`, a spot being `False`, `True`, the leaf's shape (an element mask) or `None` (a
    0-d mask); `None` for any other mask, which the walk reads and reports."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    flags, mask_def = jax.tree_util.tree_flatten(mask)
    if mask_def != treedef:
        return None
    spots: list[Any] = []
    arrays = ARRAY_CLASSES
    for flag, leaf in zip(flags, leaves):
        if flag is True or flag is False:
            spots.append(flag)
            continue
        cls = type(flag)
        if cls is np.bool_:
            spots.append(bool(flag))
            continue
        if cls not in arrays:
            if not isinstance(flag, (jax.Array, np.ndarray)):
                return None
            arrays.add(cls)
        dtype = flag.dtype
        if dtype is not _BOOL and dtype != _BOOL:
            return None
        shape = flag.shape
        if not shape:
            spots.append(None)
        elif shape == (leaf.shape if type(leaf) in arrays else shape_of(leaf)):
            spots.append(shape)
        else:
            return None
    if not any(spot is not False for spot in spots):
        return None
    return leaves, treedef, flags, spots


def and_masks(outer: Any, inner: Any) -> Any:
    if outer is None:
        return inner
    if inner is None:
        return outer
    return jnp.logical_and(outer, inner)


def any_true(flag: object) -> bool:
    """Whether a flag of `mask()` selects its leaf, in whole or in part."""
    return flag is True or (flag is not False and bool(np.any(np.asarray(flag))))


def shape_of(x: Any) -> tuple[int, ...]:
    shape = getattr(x, "shape", None)
    if shape is not None:
        return tuple(shape)
    return () if isinstance(x, (int, float, complex, bool)) else np.shape(x)


def broadcasts_to(small: tuple[int, ...], big: tuple[int, ...]) -> bool:
    """Whether an array of shape `small` broadcasts to `big` without changing `big`."""
    if small == big or not small:
        return True
    if len(small) > len(big):
        return False
    return all(s == 1 or s == b for s, b in zip(reversed(small), reversed(big)))


def check_element_mask(mask: object, leaf: object, where: Callable[[], str]) -> None:
    mask_shape, leaf_shape = shape_of(mask), shape_of(leaf)
    if not broadcasts_to(mask_shape, leaf_shape):
        raise ValueError(
            ELEMENT_MASK_SHAPE_MSG.format(
                where=where(), mask_shape=mask_shape, leaf_shape=leaf_shape
            )
        )
