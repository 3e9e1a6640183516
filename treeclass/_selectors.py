"""Selectors for `.at[...]`: what each kind of selector matches, one tree level at a time.

A selector is compiled once (by `compile_selector`, when `.at[...]` is indexed) into a
*matcher*. The walker in `_at.py` drives every matcher through the same small protocol,
so that unions (`at["a", Linear]`) and chains combine freely:

- `initial(node, path, walker)`: the matcher's state when its level starts at `node`;
- `enter(state, node, kind, opened, path, walker)`: looking into `node` (whose children
  are `opened`, or `None` for a leaf), answer `(SELF, mask)` (the node itself is
  selected, `mask` an element mask or `None`), `(NOTHING, None)`, or
  `(CHILDREN, node_state)`;
- `step(node_state, k, entry, child, child_path)`: for the `k`-th child answer
  `(PRUNE, None)`, `(MATCH, mask)` or `(DESCEND, state)` (keep looking below it, at the
  same level);
- `finish(node_state, node, kind, opened, path, walker)`: raise when a required key was
  not found.

This module also knows how to open one node (its key entries, its children, how to
rebuild it): the walker and the mask matcher both need it.
"""

from __future__ import annotations

import abc
import difflib
import fnmatch
import functools
import re
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.tree_util import DictKey, FlattenedIndexKey, GetAttrKey, SequenceKey

from . import _mask

__all__ = ["BaseKey", "where", "glob"]

# -- node access ---------------------------------------------------------------------------

LEAF, TREECLASS, DICT, LIST, TUPLE, NAMEDTUPLE, NONE, GENERIC = range(8)

# Exact types only: a subclass (OrderedDict, a custom list) may be registered differently.
_BUILTIN_KINDS: dict[type, int] = {
    dict: DICT,
    list: LIST,
    tuple: TUPLE,
    type(None): NONE,
    float: LEAF,
    int: LEAF,
    bool: LEAF,
    complex: LEAF,
    str: LEAF,
    bytes: LEAF,
    np.ndarray: LEAF,
}


# Concrete array and tracer classes seen so far. A speed cache only: jax never treats an
# array as a node, so membership cannot go stale; adding to a set is atomic under the GIL.
_ARRAY_TYPES: set[type] = set()


def node_kind(node: Any, is_leaf: Callable[[Any], bool] | None = None) -> int:
    """A cheap classification of `node`; `GENERIC` may still turn out to be a leaf."""
    if is_leaf is not None and is_leaf(node):
        return LEAF
    cls = type(node)
    kind = _BUILTIN_KINDS.get(cls)
    if kind is not None:
        return kind
    if cls in _ARRAY_TYPES:
        return LEAF
    if hasattr(cls, "_tc_fields"):  # a TreeClass (duck typed: no import of _treeclass)
        return TREECLASS
    if isinstance(node, (jax.Array, np.generic)):  # tracers are jax.Array instances
        if isinstance(node, jax.Array):
            _ARRAY_TYPES.add(cls)
        return LEAF
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        return NAMEDTUPLE
    return GENERIC


def treeclass_names(node: Any) -> tuple[str, ...]:
    """The names of a TreeClass instance's children, in flatten order."""
    names = getattr(getattr(node, "_tc_layout", None), "leaf_names", None)
    if names is None:  # unsealed (inside `.at["method"]()`) or a failed __init__
        statics = type(node)._tc_static_names
        names = tuple(n for n in node.__dict__ if n not in statics)
    return names


def open_node(node: Any, kind: int) -> tuple[tuple[Any, ...], list[Any], Any] | None:
    """`(entries, children, aux)` of one node, or `None` for a leaf; `aux` feeds `rebuild`."""
    if kind == TREECLASS:
        names = treeclass_names(node)
        layout = getattr(node, "_tc_layout", None)
        entries = getattr(layout, "keys", None)
        if entries is None or getattr(layout, "leaf_names", None) is not names:
            entries = tuple(GetAttrKey(n) for n in names)
        d = node.__dict__
        return entries, [d[n] for n in names], names
    if kind == DICT:
        try:
            keys = sorted(node)  # the order jax flattens a dict in
        except TypeError:
            return _open_generic(node)
        return tuple(DictKey(k) for k in keys), [node[k] for k in keys], keys
    if kind == LIST or kind == TUPLE:
        return tuple(SequenceKey(i) for i in range(len(node))), list(node), None
    if kind == NAMEDTUPLE:
        return tuple(GetAttrKey(f) for f in type(node)._fields), list(node), None
    if kind == NONE:
        return (), [], None
    if kind == LEAF:
        return None
    return _open_generic(node)


def _open_generic(node: Any) -> tuple[tuple[Any, ...], list[Any], Any] | None:
    # one level only: every child is forced to be a leaf of this flatten
    pairs, treedef = jax.tree_util.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)
    if treedef.num_nodes == 1 and treedef.num_leaves == 1:
        return None  # not a registered node: a leaf
    return tuple(p[0] for p, _ in pairs), [c for _, c in pairs], treedef


def rebuild(node: Any, kind: int, aux: Any, children: list[Any]) -> Any:
    """`node` with its children replaced by `children` (same count and order)."""
    if kind == TREECLASS:
        layout = getattr(node, "_tc_layout", None)
        if layout is not None and aux is getattr(layout, "leaf_names", None):
            # a sealed instance opened by `open_node`: unflatten through its layout
            return layout.build(layout, tuple(children))
        # the layout (names, statics) is unchanged: a cheap copy with the children replaced
        return node._tc_replace(dict(zip(aux, children, strict=True)))
    if kind == DICT:
        if isinstance(aux, list):
            new = dict(node)  # keeps the caller's insertion order
            for key, child in zip(aux, children, strict=True):
                new[key] = child
            return new
        return aux.unflatten(children)
    if kind == LIST:
        return children
    if kind == TUPLE:
        return tuple(children)
    if kind == NAMEDTUPLE:
        return node._make(children)
    if kind == NONE:
        return node
    return aux.unflatten(children)


def entry_name(entry: Any) -> Any:
    """The name a key entry stands for: attribute name, dict key, or sequence index."""
    cls = type(entry)
    if cls is GetAttrKey:
        return entry.name
    if cls is DictKey:
        return entry.key
    if cls is SequenceKey:
        return entry.idx
    if cls is FlattenedIndexKey:
        return entry.key
    for attribute in ("name", "key", "idx"):
        if hasattr(entry, attribute):
            return getattr(entry, attribute)
    return entry


def child_by_entry(node: Any, entry: Any) -> tuple[bool, Any]:
    """`(found, child)`: the child of `node` under key `entry` (jax structure only)."""
    kind = node_kind(node)
    opened = open_node(node, kind)
    if opened is None:
        return False, None
    entries, children, _ = opened
    for e, c in zip(entries, children, strict=True):
        if e == entry:
            return True, c
    return False, None


def is_frozen(x: Any) -> bool:
    # through the module so that `_mask` can be rebuilt by its owner independently
    return _mask.is_frozen(x)


# -- public selector types -------------------------------------------------------------------


class BaseKey(abc.ABC):
    """Base class for user-defined matching of key entries in `.at[...]`.

    Subclass it and implement `__eq__(self, entry)`: it receives each key entry at the
    current level (`jax.tree_util.GetAttrKey`, `DictKey`, `SequenceKey`,
    `FlattenedIndexKey`, or a custom node's own key type) and returns whether that child
    is selected. An instance is a selector like a name: it matches children of the
    current level only.

    ```python
    import jax
    import treeclass as tc

    class StartsWith(tc.BaseKey):
        def __init__(self, prefix):
            self.prefix = prefix

        def __eq__(self, entry):
            return isinstance(entry, jax.tree_util.DictKey) and entry.key.startswith(self.prefix)

    tree = {"w1": 1.0, "w2": 2.0, "b": 3.0}
    assert tc.at(tree)[StartsWith("w")].set(0.0) == {"w1": 0.0, "w2": 0.0, "b": 3.0}
    ```
    """

    @abc.abstractmethod
    def __eq__(self, entry: Any) -> bool: ...

    __hash__ = object.__hash__


class _Where:
    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[tuple[Any, ...], Any], Any]) -> None:
        self.fn = fn

    def __repr__(self) -> str:
        return f"where({getattr(self.fn, '__qualname__', repr(self.fn))})"


def where(fn: Callable[[tuple[Any, ...], Any], Any]) -> Any:
    """A predicate selector: selects every node for which `fn(path, node)` is true.

    `path` is the node's full key path from the root (a tuple of `jax.tree_util` key
    entries, as in `tree_flatten_with_path`); `node` is a subtree or a leaf. Nodes are
    visited below the current level, parents before children; a node that matches is
    selected whole and not looked into. `fn` may return a boolean array for a leaf: it
    then selects elements of that leaf, as a mask would.

    **Arguments**

    - `fn`: a callable `(path, node) -> bool`.

    **Returns**

    A selector for `.at[...]`.

    ```python
    import jax.numpy as jnp
    import treeclass as tc

    tree = {"a": jnp.ones(2), "b": {"c": jnp.ones(3)}}
    big = tc.where(lambda path, node: getattr(node, "size", 0) > 2)
    assert tc.at(tree)[big].get()["b"]["c"].shape == (3,)
    ```
    """
    if not callable(fn):
        raise TypeError(f"`where` expects a callable `(path, node) -> bool`, got {fn!r}.")
    return _Where(fn)


_GLOB_SYNTAX = (
    "Glob syntax: segments separated by '.', each matched against a key's name with "
    "fnmatch wildcards ('*', '?'); '[0]' or '0' for a sequence index, \"['key']\" for a "
    "dict key, '**' for any number of levels. Examples: 'layers.*.weight', '**.bias', "
    "'layers[0].weight'."
)


class _Glob:
    __slots__ = ("pattern", "segments", "compiled", "matcher")

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self.segments = _parse_glob(pattern)
        self.compiled = tuple(
            None if s == "**" else re.compile(fnmatch.translate(s)).match for s in self.segments
        )
        self.matcher: GlobMatcher | None = None  # built on first use, then shared

    def __repr__(self) -> str:
        return f"glob({self.pattern!r})"


def _parse_glob(pattern: str) -> tuple[str, ...]:
    segments: list[str] = []
    current = ""
    after_bracket = False
    text = pattern[1:] if pattern.startswith(".") else pattern  # keystr paths start with '.'
    i, n = 0, len(text)
    while i < n:
        char = text[i]
        if char == ".":
            if current:
                segments.append(current)
            elif not after_bracket:
                raise ValueError(f"Empty segment in glob {pattern!r}. {_GLOB_SYNTAX}")
            current, after_bracket = "", False
            i += 1
            if i == n:
                raise ValueError(f"Glob {pattern!r} ends with '.'. {_GLOB_SYNTAX}")
        elif char == "[":
            if current:
                segments.append(current)
                current = ""
            close = _bracket_end(text, i, pattern)
            content = text[i + 1 : close].strip()
            if len(content) >= 2 and content[0] == content[-1] and content[0] in "'\"":
                content = content[1:-1]
            if not content:
                raise ValueError(f"Empty brackets in glob {pattern!r}. {_GLOB_SYNTAX}")
            segments.append(content)
            after_bracket = True
            i = close + 1
        elif char == "]":
            raise ValueError(f"Unbalanced ']' in glob {pattern!r}. {_GLOB_SYNTAX}")
        else:
            if after_bracket:
                raise ValueError(
                    f"Expected '.' or '[' after ']' in glob {pattern!r}. {_GLOB_SYNTAX}")
            current += char
            i += 1
    if current:
        segments.append(current)
    if not segments:
        raise ValueError(f"Empty glob pattern. {_GLOB_SYNTAX}")
    return tuple(segments)


def _bracket_end(text: str, start: int, pattern: str) -> int:
    i = start + 1
    quote = text[i] if i < len(text) and text[i] in "'\"" else None
    if quote is not None:
        end_quote = text.find(quote, i + 1)
        if end_quote < 0:
            raise ValueError(f"Unclosed quote in glob {pattern!r}. {_GLOB_SYNTAX}")
        i = end_quote + 1
    close = text.find("]", i)
    if close < 0:
        raise ValueError(f"Unclosed '[' in glob {pattern!r}. {_GLOB_SYNTAX}")
    return close


@functools.lru_cache(maxsize=256)
def _compiled_glob(pattern: str) -> _Glob:
    # `tc.glob("...")` written inline in a loop returns the same object, whose matcher
    # keeps its memoized transitions (a pure function of the pattern)
    return _Glob(pattern)


def glob(pattern: str) -> Any:
    """A key-path pattern: one string that reaches nodes any number of levels down.

    **Syntax.** The pattern is a sequence of segments, each matching one level of the
    key path below the current level:

    - segments are separated by `.`; a leading `.` is allowed, so the output of
      `jax.tree_util.keystr` for a path is a pattern matching that path;
    - a segment is matched against the key's name with `fnmatch` wildcards, case
      sensitively: `*` (any characters), `?` (one character). The name of an attribute
      (`GetAttrKey`) is its name, of a dict entry `str(key)`, of a sequence entry its
      index in decimal (`0`, `1`, ...; negative indices are not supported);
    - `[...]` is a segment of its own, so `layers[0]` is `layers.0`; inside brackets a
      quoted name (`['a.b']`) may contain `.` and `[`;
    - `**` matches any number of levels, including none.

    The whole pattern must match: `"layers.*"` selects each layer (whole subtrees),
    `"layers.*.weight"` each layer's weight. A matching node is not looked into further.

    **Arguments**

    - `pattern`: the pattern string.

    **Returns**

    A selector for `.at[...]`.

    ```python
    import treeclass as tc

    tree = {"layers": [{"weight": 1.0, "bias": 0.0}, {"weight": 2.0, "bias": 0.0}]}
    new = tc.at(tree)[tc.glob("layers.*.weight")].apply(lambda w: w * 10)
    assert [layer["weight"] for layer in new["layers"]] == [10.0, 20.0]
    assert tc.at(tree)[tc.glob("**.bias")].reduce(lambda a, b: a + b) == 0.0
    ```
    """
    if not isinstance(pattern, str):
        raise TypeError(f"`glob` expects a pattern string, got {pattern!r}.")
    return _compiled_glob(pattern)


# -- matchers --------------------------------------------------------------------------------

SELF, NOTHING, CHILDREN = 0, 1, 2
PRUNE, MATCH, DESCEND = 0, 1, 2
_PRUNED = (PRUNE, None)
_MATCHED = (MATCH, None)
_NOTHING = (NOTHING, None)
_SELF = (SELF, None)


class Matcher:
    """One compiled selector; see the module docstring for the protocol."""

    __slots__ = ()
    single_key = False  # a plain name or index: the walker may look the child up directly

    def initial(self, node: Any, path: tuple[Any, ...], walker: Any) -> Any:
        return None

    def enter(self, state, node, kind, opened, path, walker) -> tuple[int, Any]:
        return _NOTHING if opened is None else (CHILDREN, state)

    def step(self, state, k, entry, child, child_path) -> tuple[int, Any]:
        raise NotImplementedError

    def finish(self, state, node, kind, opened, path, walker) -> None:
        pass


# Long messages, next to the checks that raise them (filled by `_at` with the key path).
NOT_FOUND_MSG = "{key!r} not found at {where}{hint}"
STATIC_FIELD_MSG = (
    "{key!r} at {where} is a static field (`tc.field(static=True)`): it is part of the tree "
    "definition, not a leaf, so `.at` cannot select it. Change it on a copy inside a method,\n"
    "    value, tree = tree.at['method_that_sets_{key}'](...)\n"
    "or make it a leaf: `{key}: ... = tc.field()`."
)
LEAF_HAS_NO_CHILDREN_MSG = "{key!r} not found at {where}: it is a leaf, {leaf}, with no children."
FROZEN_HAS_NO_CHILDREN_MSG = (
    "{key!r} not found at {where}: it is a frozen value (`tc.freeze`), which has no children. "
    "Select the frozen value itself with `is_leaf=tc.is_frozen`, or unfreeze it first."
)
INDEX_OUT_OF_RANGE_MSG = (
    "index {key} out of range at {where}: a {type} of length {length} "
    "(valid indices: {low} to {high})."
)
INDEX_ON_NAMED_MSG = (
    "index {key} is not a child of {where}: a `{type}` has named children ({names}); "
    "select them by name, e.g. .at[{first!r}]."
)


def _leaf_summary(x: Any) -> str:
    shape = getattr(x, "shape", None)
    dtype = getattr(x, "dtype", None)
    if shape is not None and dtype is not None:
        return f"an array {dtype}{list(shape)}"
    return f"a `{type(x).__name__}`"


def missing_key_error(key: Any, node: Any, kind: int, opened: Any, where: str) -> Exception:
    """The error for a name or index selector that matched no child of `node`."""
    if opened is None:
        return LookupError(LEAF_HAS_NO_CHILDREN_MSG.format(key=key, where=where,
                                                          leaf=_leaf_summary(node)))
    entries = opened[0]
    if not entries and is_frozen(node):
        return LookupError(FROZEN_HAS_NO_CHILDREN_MSG.format(key=key, where=where))
    if kind == TREECLASS and isinstance(key, str) and key in type(node)._tc_static_names:
        return LookupError(STATIC_FIELD_MSG.format(key=key, where=where))
    names = [entry_name(e) for e in entries]
    if isinstance(key, int) and kind in (LIST, TUPLE, NAMEDTUPLE):
        n = len(entries)
        return IndexError(INDEX_OUT_OF_RANGE_MSG.format(
            key=key, where=where, type=type(node).__name__, length=n, low=-n, high=n - 1))
    if isinstance(key, int) and names and all(isinstance(x, str) for x in names):
        shown = ", ".join(repr(x) for x in names)
        return IndexError(INDEX_ON_NAMED_MSG.format(
            key=key, where=where, type=type(node).__name__, names=shown, first=names[0]))
    hint = ""
    if isinstance(key, str):
        close = difflib.get_close_matches(key, [x for x in names if isinstance(x, str)], n=1)
        if close:
            hint += f"; did you mean {close[0]!r}?"
    if names:
        hint += f"{'' if hint else '.'} Children there: {', '.join(repr(x) for x in names)}."
    else:
        hint += f": a `{type(node).__name__}` with no children."
    if kind == TREECLASS and type(node)._tc_static_names:
        statics = ", ".join(repr(x) for x in type(node)._tc_static_names)
        hint += f" Static fields (not selectable): {statics}."
    elif kind == GENERIC and isinstance(key, str) and hasattr(node, key):
        hint += (f" `{type(node).__name__}` has an attribute {key!r}, but it is not a child "
                 "of the tree (a static field, a property or a method).")
    return LookupError(NOT_FOUND_MSG.format(key=key, where=where, hint=hint))


def _record_statics(node: Any, kind: int, path: tuple[Any, ...], walker: Any,
                    matches: Callable[[Any], bool]) -> None:
    """Note static fields a level selector would have matched (for the empty-selection error)."""
    if kind != TREECLASS:
        return
    for name in type(node)._tc_static_names:
        if name in node.__dict__ and matches(GetAttrKey(name)):
            walker.record_blocked(path + (GetAttrKey(name),), "a static field")


class _SingleKeyMatcher(Matcher):
    """A selector naming one child: the fast path walks it, and missing it is an error."""

    __slots__ = ("key",)
    single_key = True

    def __init__(self, key: Any) -> None:
        self.key = key

    def finish(self, state, node, kind, opened, path, walker):
        if not state[0]:
            raise walker.missing(self.key, node, kind, opened, path)

    def __repr__(self) -> str:
        return repr(self.key)


class NameMatcher(_SingleKeyMatcher):
    """`"name"`: the attribute or dict key `name` among the children."""

    __slots__ = ()

    def enter(self, state, node, kind, opened, path, walker):
        if opened is None:
            raise walker.missing(self.key, node, kind, opened, path)
        return CHILDREN, [False]

    def step(self, state, k, entry, child, child_path):
        cls = type(entry)
        if (cls is GetAttrKey and entry.name == self.key) or (
            cls is DictKey and entry.key == self.key
        ) or (cls not in (GetAttrKey, DictKey) and entry_name(entry) == self.key):
            state[0] = True
            return _MATCHED
        return _PRUNED


class IndexMatcher(_SingleKeyMatcher):
    """`0`, `-1`: a sequence position (negative counts from the end), or an int dict key."""

    __slots__ = ()

    def enter(self, state, node, kind, opened, path, walker):
        if opened is None:
            raise walker.missing(self.key, node, kind, opened, path)
        n = len(opened[0])
        position = self.key + n if self.key < 0 else self.key
        return CHILDREN, [False, position, kind in (LIST, TUPLE, NAMEDTUPLE)]

    def step(self, state, k, entry, child, child_path):
        cls = type(entry)
        if state[2] or cls is SequenceKey or cls is FlattenedIndexKey:
            hit = k == state[1]
        elif cls is DictKey:
            hit = type(entry.key) is not bool and entry.key == self.key
        elif cls is GetAttrKey:
            hit = False
        else:
            hit = entry_name(entry) == self.key
        if hit:
            state[0] = True
            return _MATCHED
        return _PRUNED


class EllipsisMatcher(Matcher):
    """`...`: every child; on a leaf, the leaf itself."""

    __slots__ = ()

    def enter(self, state, node, kind, opened, path, walker):
        if opened is None:
            return _SELF
        _record_statics(node, kind, path, walker, lambda entry: True)
        return CHILDREN, None

    def step(self, state, k, entry, child, child_path):
        return _MATCHED

    def __repr__(self) -> str:
        return "..."


class PatternMatcher(Matcher):
    """`re.compile(p)`: children whose name (as a string) fully matches `p`."""

    __slots__ = ("pattern",)

    def __init__(self, pattern: re.Pattern) -> None:
        self.pattern = pattern

    def _matches(self, entry: Any) -> bool:
        return self.pattern.fullmatch(str(entry_name(entry))) is not None

    def enter(self, state, node, kind, opened, path, walker):
        if opened is None:
            return _NOTHING
        _record_statics(node, kind, path, walker, self._matches)
        return CHILDREN, None

    def step(self, state, k, entry, child, child_path):
        return _MATCHED if self._matches(entry) else _PRUNED

    def __repr__(self) -> str:
        return f"re.compile({self.pattern.pattern!r})"


class BaseKeyMatcher(Matcher):
    """A `BaseKey` instance: children whose entry it says it equals."""

    __slots__ = ("key",)

    def __init__(self, key: BaseKey) -> None:
        self.key = key

    def _matches(self, entry: Any) -> bool:
        result = self.key.__eq__(entry)
        return result is not NotImplemented and bool(result)

    def enter(self, state, node, kind, opened, path, walker):
        if opened is None:
            return _NOTHING
        _record_statics(node, kind, path, walker, self._matches)
        return CHILDREN, None

    def step(self, state, k, entry, child, child_path):
        return _MATCHED if self._matches(entry) else _PRUNED

    def __repr__(self) -> str:
        return repr(self.key)


class TypeMatcher(Matcher):
    """A class: every node below that is an instance of it, not looking into a match."""

    __slots__ = ("cls",)

    def __init__(self, cls: type) -> None:
        self.cls = cls

    def step(self, state, k, entry, child, child_path):
        return _MATCHED if isinstance(child, self.cls) else (DESCEND, None)

    def __repr__(self) -> str:
        return self.cls.__name__


class WhereMatcher(Matcher):
    """`where(fn)`: every node below for which `fn(path, node)` holds."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[tuple[Any, ...], Any], Any]) -> None:
        self.fn = fn

    def step(self, state, k, entry, child, child_path):
        result = self.fn(child_path, child)
        if result is True:
            return _MATCHED
        if result is False or result is None:
            return (DESCEND, None)
        if isinstance(result, (jax.Array, np.ndarray)) and result.dtype == np.bool_:
            if isinstance(result, jax.core.Tracer) or result.ndim:
                return (MATCH, result)  # an element mask for this node's leaves
        return _MATCHED if bool(result) else (DESCEND, None)

    def __repr__(self) -> str:
        return repr(_Where(self.fn))


class GlobMatcher(Matcher):
    """`glob(pattern)`: nodes whose key path below the current level matches `pattern`.

    The pattern runs as a small NFA whose state is the set of pattern positions reached;
    transitions are memoized per (state, name), since layers repeat the same names.
    """

    __slots__ = ("glob", "start", "accept", "transitions")

    # memoization only (a pure function of the pattern): bounded, so a tree with
    # unboundedly many distinct names cannot grow it without limit
    _MAX_TRANSITIONS = 4096

    def __init__(self, glob_: _Glob) -> None:
        self.glob = glob_
        self.accept = len(glob_.segments)
        self.start = self._closure(frozenset([0]))
        self.transitions: dict[tuple[frozenset[int], Any], frozenset[int]] = {}

    def _closure(self, positions: frozenset[int]) -> frozenset[int]:
        segments = self.glob.segments
        out = set(positions)
        todo = list(positions)
        while todo:  # '**' may match no level at all: skip over it
            p = todo.pop()
            if p < len(segments) and segments[p] == "**" and p + 1 not in out:
                out.add(p + 1)
                todo.append(p + 1)
        return frozenset(out)

    def _advance(self, state: frozenset[int], entry: Any) -> frozenset[int]:
        name = entry_name(entry)
        key = (state, name)
        try:
            return self.transitions[key]
        except KeyError:
            pass
        except TypeError:  # an unhashable custom key name
            key = None
        text = name if isinstance(name, str) else str(name)
        compiled = self.glob.compiled
        nxt: set[int] = set()
        for p in state:
            if p >= self.accept:
                continue
            match = compiled[p]
            if match is None:
                nxt.add(p)  # '**' consumes this level and may consume more
            elif match(text):
                nxt.add(p + 1)
        result = self._closure(frozenset(nxt)) if nxt else frozenset()
        if key is not None and len(self.transitions) < self._MAX_TRANSITIONS:
            self.transitions[key] = result
        return result

    def initial(self, node, path, walker):
        return self.start

    def enter(self, state, node, kind, opened, path, walker):
        if opened is None:
            return _NOTHING
        if not opened[0] and kind == GENERIC and is_frozen(node):
            walker.record_blocked(path, "frozen")  # the pattern leads through a frozen value
        if kind == TREECLASS and type(node)._tc_static_names:
            accept = self.accept
            _record_statics(node, kind, path, walker, lambda e: accept in self._advance(state, e))
        return CHILDREN, state

    def step(self, state, k, entry, child, child_path):
        nxt = self._advance(state, entry)
        if self.accept in nxt:
            return _MATCHED
        return (DESCEND, nxt) if nxt else _PRUNED

    def __repr__(self) -> str:
        return repr(self.glob)


# -- masks -------------------------------------------------------------------------------------

MASK_LEAF_MSG = (
    "The mask leaf at {where} is {value!r} (of type {type}); a mask holds Python bools or "
    "boolean arrays, e.g. built with `jax.tree_util.tree_map(lambda x: x > 0, tree)`."
)
MASK_MISMATCH_MSG = (
    "The mask's structure does not match the tree at {where}: the tree has {tree_has}, the "
    "mask has {mask_has}. A mask must have the tree's structure (or a prefix of it), with a "
    "bool or a boolean array in place of each selected leaf or subtree.{extra}"
)


def _is_bool_array(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray)) and x.dtype == np.bool_


def mask_leaf_value(x: Any) -> Any:
    """`True`/`False` for a static mask leaf, the array for an element mask, else `None`."""
    if x is True or x is False:
        return x
    if isinstance(x, np.bool_):
        return bool(x)
    if _is_bool_array(x):
        return x
    return None


def _is_other_selector(x: Any) -> bool:
    if x is Ellipsis or (isinstance(x, (str, bytes, int, float, complex, type))
                         and not isinstance(x, bool)):
        return True
    return isinstance(x, (re.Pattern, BaseKey, _Where, _Glob))


def is_mask_like(x: Any) -> bool:
    """Whether `x` is taken for a boolean mask selector: a bool, a boolean array, or a
    container none of whose children is another kind of selector.

    Only the first level is looked at, so that indexing with a big mask stays cheap; a
    leaf that is not a bool is reported, with its path, when the mask is used.
    """
    if mask_leaf_value(x) is not None:
        return True
    if x is None or _is_other_selector(x):
        return False
    opened = open_node(x, node_kind(x))
    if opened is None:
        return False  # a leaf that is neither a bool nor a boolean array
    return not any(_is_other_selector(child) for child in opened[1])


def _describe_children(kind: int, node: Any, opened: Any) -> str:
    if opened is None:
        return f"a leaf ({_leaf_summary(node)})"
    names = ", ".join(repr(entry_name(e)) for e in opened[0])
    return f"a `{type(node).__name__}` with children ({names})"


def mask_mismatch(mask: Any, tree: Any, path: tuple[Any, ...], is_leaf: Any,
                  ) -> tuple[tuple[Any, ...], str, str] | None:
    """Where `mask` stops being a prefix of `tree`: `(path, tree_has, mask_has)`, or `None`."""
    if mask_leaf_value(mask) is not None:
        return None
    kind = node_kind(tree, is_leaf)
    opened = open_node(tree, kind)
    mask_kind = node_kind(mask)
    mask_opened = open_node(mask, mask_kind)
    if mask_opened is None:
        return path, _describe_children(kind, tree, opened), f"{mask!r}"
    if opened is None or type(mask) is not type(tree) or mask_opened[0] != opened[0]:
        return (path, _describe_children(kind, tree, opened),
                _describe_children(mask_kind, mask, mask_opened))
    for entry, m, t in zip(opened[0], mask_opened[1], opened[1], strict=True):
        found = mask_mismatch(m, t, path + (entry,), is_leaf)
        if found is not None:
            return found
    return None


class MaskMatcher(Matcher):
    """A boolean mask pytree, aligned with the whole tree or with the current node."""

    __slots__ = ("mask",)

    def __init__(self, mask: Any) -> None:
        self.mask = mask

    def initial(self, node, path, walker):
        if not path:
            return self.mask
        aligned = walker.memo.get(self)
        if aligned is None:
            # A mask built from the whole tree (`tree > 0`) used after a path selector.
            fits = mask_mismatch(self.mask, walker.root, (), walker.is_leaf) is None
            aligned = walker.memo[self] = "root" if fits else "node"
        if aligned == "node":
            return self.mask
        sub = self.mask
        for entry in path:
            if mask_leaf_value(sub) is not None:
                break  # a prefix mask: this leaf covers the whole subtree
            found, sub = child_by_entry(sub, entry)
            if not found:  # unreachable once `fits`, but fail loudly rather than guess
                raise walker.mask_error(path, "a child " + repr(entry), "none")
        return sub

    def enter(self, state, node, kind, opened, path, walker):
        value = mask_leaf_value(state)
        if value is True:
            return _SELF
        if value is False:
            return _NOTHING
        if value is not None:
            return (SELF, value)
        if type(state) is type(node) and opened is not None:
            # fast structural checks for the common node kinds
            if kind == LIST or kind == TUPLE:
                if len(state) == len(node):
                    return CHILDREN, state
            elif kind == TREECLASS:
                names = opened[2]
                if treeclass_names(state) == names:
                    d = state.__dict__
                    return CHILDREN, [d[n] for n in names]
            elif kind == DICT and isinstance(opened[2], list):
                if len(state) == len(node) and all(k in state for k in opened[2]):
                    return CHILDREN, [state[k] for k in opened[2]]
        mask_kind = node_kind(state)
        mask_opened = open_node(state, mask_kind)
        if mask_opened is None:
            raise ValueError(MASK_LEAF_MSG.format(
                where=walker.where(path), value=state, type=type(state).__name__))
        if opened is None or type(state) is not type(node) or mask_opened[0] != opened[0]:
            raise walker.mask_error(path, _describe_children(kind, node, opened),
                                    _describe_children(mask_kind, state, mask_opened))
        return CHILDREN, mask_opened[1]

    def step(self, state, k, entry, child, child_path):
        m = state[k]
        if m is True or m is False:
            return _MATCHED if m else _PRUNED
        value = mask_leaf_value(m)
        if value is True:
            return _MATCHED
        if value is False:
            return _PRUNED
        if value is not None:
            return (MATCH, value)
        return (DESCEND, m)

    def __repr__(self) -> str:
        return f"mask({type(self.mask).__name__})"


class UnionMatcher(Matcher):
    """A tuple of selectors at one level: a node is selected when any member selects it."""

    __slots__ = ("members",)

    def __init__(self, members: tuple[Matcher, ...]) -> None:
        self.members = members

    def initial(self, node, path, walker):
        return tuple(m.initial(node, path, walker) for m in self.members)

    def enter(self, state, node, kind, opened, path, walker):
        entered: list[Any] = []
        selected = False
        element_mask: Any = None
        for member, member_state in zip(self.members, state, strict=True):
            if member_state is _SKIP:
                entered.append(_SKIP)
                continue
            code, payload = member.enter(member_state, node, kind, opened, path, walker)
            if code == SELF:
                element_mask = _union_masks(element_mask, payload, selected)
                selected = True
            entered.append((CHILDREN, payload) if code == CHILDREN else _SKIP)
        if selected:
            return SELF, element_mask
        if all(e is _SKIP for e in entered):
            return _NOTHING
        return CHILDREN, entered

    def step(self, state, k, entry, child, child_path):
        selected = False
        element_mask: Any = None
        descend: list[Any] | None = None
        for i, (member, entered) in enumerate(zip(self.members, state, strict=True)):
            if entered is _SKIP:
                continue
            code, payload = member.step(entered[1], k, entry, child, child_path)
            if code == MATCH:
                element_mask = _union_masks(element_mask, payload, selected)
                selected = True
            elif code == DESCEND:
                if descend is None:
                    descend = [_SKIP] * len(self.members)
                descend[i] = payload
        if selected:
            return MATCH, element_mask
        if descend is not None:
            return DESCEND, tuple(descend)
        return _PRUNED

    def finish(self, state, node, kind, opened, path, walker):
        for member, entered in zip(self.members, state, strict=True):
            if entered is not _SKIP:
                member.finish(entered[1], node, kind, opened, path, walker)

    def __repr__(self) -> str:
        return "(" + ", ".join(repr(m) for m in self.members) + ")"


class _Skip:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<skip>"


_SKIP = _Skip()


def _union_masks(current: Any, new: Any, already_selected: bool) -> Any:
    # `None` means "all elements": it absorbs any element mask
    if not already_selected:
        return new
    if current is None or new is None:
        return None
    return jnp.logical_or(current, new)


# -- compiling -------------------------------------------------------------------------------

SUPPORTED_SELECTORS = (
    "a str name (attribute or dict key), an int index (negative counts from the end), "
    "`...` (every child), `re.compile(pattern)` (names matching at this level), a class "
    "(every instance at any depth), `tc.where(fn)`, `tc.glob(pattern)`, a `tc.BaseKey` "
    "instance, a boolean mask (a bool, a boolean array or a pytree of them), or a tuple of "
    "these (their union at one level)"
)
UNSUPPORTED_MSG = (
    "Unsupported selector {selector!r} of type `{type}` in `{where}`. Supported: "
    "{supported}.{hint}"
)


def compile_selector(selector: Any, where: Callable[[], str]) -> Matcher:
    """The matcher for one `.at[...]` selector; `where()` shows the selection, for errors."""
    cls = type(selector)
    if cls is str:
        return NameMatcher(selector)
    if cls is int:
        return IndexMatcher(selector)
    if selector is Ellipsis:
        return EllipsisMatcher()
    if cls is tuple:
        if selector and all(is_mask_like(s) for s in selector):
            return MaskMatcher(selector)  # a tuple of bools is a mask for a tuple tree
        return UnionMatcher(tuple(compile_selector(s, where) for s in selector))
    if isinstance(selector, (bool, np.bool_)):
        return MaskMatcher(bool(selector))
    if isinstance(selector, str):
        return NameMatcher(str(selector))
    if isinstance(selector, (int, np.integer)):
        return IndexMatcher(int(selector))
    if isinstance(selector, re.Pattern):
        return PatternMatcher(selector)
    if isinstance(selector, BaseKey):
        return BaseKeyMatcher(selector)
    if isinstance(selector, _Where):
        return WhereMatcher(selector.fn)
    if isinstance(selector, _Glob):
        if selector.matcher is None:
            selector.matcher = GlobMatcher(selector)
        return selector.matcher
    if isinstance(selector, type):
        if issubclass(selector, BaseKey):
            raise TypeError(
                f"`{selector.__name__}` is a BaseKey class; select with an instance of it: "
                f".at[{selector.__name__}(...)]."
            )
        return TypeMatcher(selector)
    if is_mask_like(selector):
        return MaskMatcher(selector)
    hint = ""
    if isinstance(selector, list):
        hint = " For a union of keys use a tuple: .at['a', 'b']."
    elif isinstance(selector, (jax.Array, np.ndarray)):
        hint = f" An array selector must be boolean (a mask), got dtype {selector.dtype}."
    elif isinstance(selector, (float, complex)):
        hint = " Indices must be ints."
    raise NotImplementedError(UNSUPPORTED_MSG.format(
        selector=selector, type=cls.__name__, where=where(), supported=SUPPORTED_SELECTORS,
        hint=hint))
