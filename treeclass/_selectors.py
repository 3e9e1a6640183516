"""Selectors for `.at[...]`: what each kind of selector matches, one node at a time.

`compile_selector` turns a selector, once, into a *matcher*, by its type's entry in a
table (`BaseKey.def_alias` and `at.def_rule` add the user's types to it). The one walker
(`_selection`) asks `match(walk, state, node, path) -> (code, payload)` of the node a
level starts at (`state`: the matcher's `start`), then of the children the verdicts lead
to, so that unions (`at["a", Linear]`) and chains combine freely. The verdicts: `(NO,
None)`, not selected, nothing below; `(YES, mask)`, selected (`mask`: an element mask,
`None` for the whole node); `(EACH, state)`, match every child with `state`; `(ZIP,
(opened, states))`, one state per child of the node's opening; `(ONE, (entry, child,
row))`, the one child a name or index selects, found by the row without opening the
node; `(STATIC, name)`, a static field named last in a `set`/`apply` (`walk.static_ok`).
A selector that names something (a glob, a regex, a `BaseKey`) must select something:
`no_match_error` explains an empty selection with the closest keys.
"""

from __future__ import annotations

import abc
import functools
import re
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer
from jax.tree_util import DictKey, GetAttrKey, SequenceKey

from . import _node
from ._glob import Glob
from ._structure import (
    GENERIC,
    LIST,
    NAMEDTUPLE,
    TREECLASS,
    TUPLE,
    Kind,
    Mismatch,
    NodeKind,
    describe,
    entry_name,
    first_mismatch,
    node_kind,
    open_node,
    path_str,
    row_of,
    unwrap,
    wrapper_of,
)
from ._util import add_leaf_note
from ._values import closest, short_repr

# -- public selector types -------------------------------------------------------------------


class BaseKey(abc.ABC):
    """Base class for user-defined matching of key entries in `.at[...]`.

    Subclass it and implement `__eq__(self, entry)`: it receives each key entry at the
    current level (`jax.tree_util.GetAttrKey`, `DictKey`, `SequenceKey`, or a custom
    node's own key type) and returns whether that child is selected. Like a name, an
    instance matches children of the current level only, and one that matches no child
    anywhere is an error (`LookupError`). `BaseKey.def_alias` makes values of a type of
    yours stand for such keys.

    ```python
    import jax
    import treeclass as tc

    class Weights(tc.BaseKey):
        def __eq__(self, entry):
            return isinstance(entry, jax.tree_util.DictKey) and entry.key.startswith("w")

    tree = {"w1": 1.0, "w2": 2.0, "b": 3.0}
    assert tc.at(tree)[Weights()].set(0.0) == {"w1": 0.0, "w2": 0.0, "b": 3.0}
    ```
    """

    @abc.abstractmethod
    def __eq__(self, entry: object) -> bool: ...

    __hash__ = object.__hash__

    @staticmethod
    def def_alias(kind: type, converter: Callable[[Any], Any] | None = None) -> Any:
        """Make values of type `kind` selectors: `.at[value]` means `.at[converter(value)]`.

        **Arguments**

        - `kind`: the type (its subclasses too) to accept as a selector. A type whose
          values are selectors already (names, indices, `...`, slices, tuples, patterns,
          classes, key entries, `BaseKey`s, the values of boolean masks: any pytree node),
          a subclass of one, or a type they are instances of (`object`) is refused
          (`TypeError`).
        - `converter`: a function of the value returning a built-in selector (a `BaseKey`,
          a name, a mask, a tuple of these, ...; aliases do not chain), checked when the
          selector is used (`TypeError`). Without it, `def_alias(kind)` is a decorator.

        **Returns**

        The converter (so that it works as a decorator).

        ```python
        import re
        import treeclass as tc

        class Prefix:
            def __init__(self, text):
                self.text = text

        tc.BaseKey.def_alias(Prefix, lambda p: re.compile(re.escape(p.text) + ".*"))
        assert tc.at({"alpha": 1, "beta": 2})[Prefix("a")].set(0) == {"alpha": 0, "beta": 2}
        ```
        """
        if not isinstance(kind, type):
            raise TypeError(f"`def_alias` expects a type, got {kind!r}.")
        reason = _builtin_meaning(kind, namedtuple_ok=False)
        if reason:
            raise TypeError(ALIAS_BUILTIN_MSG.format(kind=_type_text(kind), reason=reason))

        def register(converter: Callable[[Any], Any]) -> Callable[[Any], Any]:
            if not callable(converter):
                raise TypeError(
                    f"`def_alias({kind.__name__})` needs a callable converter, got {converter!r}."
                )
            compile_ = functools.partial(_compile_alias, kind, converter)
            _register(kind, _UserType("an aliased type", compile_))
            return converter

        return register if converter is None else register(converter)


def where(fn: Callable[[tuple[Any, ...], Any], Any]) -> Any:
    """A predicate selector: every node below the current level for which `fn(path, node)`
    is true, selected whole (not looked into); selecting nothing is a valid, empty selection.

    **Arguments**

    - `fn`: a callable `(path, node) -> bool`, called parents first with the node's key
      path from the root (`jax.tree_util` key entries) and the node, a subtree or a leaf (a
      frozen value: the value inside, so the selection that froze nodes thaws them; the
      `.at` guide, "Model surgery"). A boolean array returned for a leaf selects its
      elements as a mask would; an error it raises names the node's key path.

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
    return WhereMatcher(fn)


# -- the matcher protocol and the matchers ----------------------------------------------------

# A verdict: `(code, payload)`, what a matcher says of one node (see the module docstring).
NO, YES, EACH, ZIP, ONE, STATIC = range(6)
_NO = (NO, None)
_YES = (YES, None)


_NONE_BLOCKED: list[Any] = []  # shared, never written: `record_blocked` makes a list


class Walk:
    """What a matcher may ask of the walk that drives it (the base of `_selection`'s
    `Selection`): `hits`, the naming matchers that selected something; `static_ok`, the
    name that may end at a static field (`set`, `apply`); `blocked`, what held no leaves,
    `(path, why, by_matcher)`, by a matcher (a static field or a wrapped value in a
    pattern's way) or at a selected spot (only wrapped values there)."""

    __slots__ = ("tree", "is_leaf", "static_ok", "hits", "kept", "blocked")

    def __init__(self, tree: Any, is_leaf: Callable[[Any], bool] | None) -> None:
        self.tree = tree
        self.is_leaf = is_leaf
        self.static_ok: Matcher | None = None
        self.hits: set[Matcher] = set()
        self.kept: dict[int, list[Any]] | None = None  # made when a matcher keeps notes
        self.blocked: list[tuple[tuple[Any, ...], str, bool]] = _NONE_BLOCKED

    def where(self, path: tuple[Any, ...]) -> str:
        """`path` as text, after the root's name."""
        return path_str(self.tree, path)

    def record_blocked(self, path: tuple[Any, ...], why: str) -> None:
        """Where the selection could not go on (a static field, a wrapped value)."""
        if self.blocked is _NONE_BLOCKED:
            self.blocked = []
        self.blocked.append((path, why, True))

    def notes(self, matcher: Matcher) -> list[Any]:
        """What `matcher` keeps for its no-match error in this walk (the key names it
        looked at, where a glob started)."""
        if self.kept is None:
            self.kept = {}
        return self.kept.setdefault(id(matcher), [])


class Matcher:
    """One compiled selector: `match(walk, state, node, path)` gives a node's verdict."""

    __slots__ = ()
    start: Any = None  # the state a level starts with, at the node it starts at
    # matches a wrapped value by the value inside it (a class, `tc.where`): with more
    # selectors after it, the walker passes such a match by, since nothing below a wrapped
    # value can be selected (the value that froze is reached again to thaw it, alone)
    sees_into_frozen = False
    names_something = False  # selecting nothing is an error (a glob, a regex, a BaseKey)
    naming = False  # it is, or holds, a matcher that names something
    one_key = False  # a name or an index (its `key`): the walker may look the child up

    def match(self, walk: Walk, state: Any, node: Any, path: tuple[Any, ...]) -> tuple[int, Any]:
        raise NotImplementedError

    def members(self) -> Iterator[Matcher]:
        yield self

    def no_match_error(self, walk: Walk, selection: str) -> Exception:
        return LookupError(f"{self!r} selects nothing in {selection}.")


# Long messages, next to the checks that raise them.
STATIC_FIELD_MSG = (
    "{key!r} at {where} is a static field (`tc.field(static=True)`): it is part of the tree "
    "definition, not a leaf. Named last in a selection, it can be set, which gives a tree "
    "of a new structure (every other operation, and selectors below it, refuse it):\n"
    "    tree = tree.at[...][{key!r}].set(value)        # or .apply(fn)\n"
    "    tree = tree.replace({key}=value)                # on the node itself\n"
    "Read it as an attribute: `node.{key}`."
)
LEAF_HAS_NO_CHILDREN_MSG = "{key!r} not found at {where}: it is a leaf, {leaf}, with no children."
WRAPPER_HAS_NO_CHILDREN_MSG = (
    "{key!r} not found at {where}: it is {what}, a node without children. Select it "
    "whole with `is_leaf` (`is_leaf=tc.is_frozen` for a frozen value), or take the value "
    "out first (`tc.unfreeze`)."
)
INDEX_OUT_OF_RANGE_MSG = (
    "index {key} out of range at {where}: a {type} of length {length} "
    "(valid indices: {low} to {high})."
)
ON_NAMED_MSG = (
    "{key} is not a child of {where}: a `{type}` has named children ({names}); select them "
    "by name, e.g. .at[{first!r}]."
)
INDEXED_CHILDREN_MSG = (
    "{key!r} not found at {where}: a `{type}` has indexed children (0 to {high}); select "
    "them by index (.at[7]), by slice (.at[0:6]) or all of them (.at[...]), then {key!r}: "
    ".at[...][{key!r}]."
)
NAMED_NOTHING_MSG = (
    "{selector!r} selects nothing in {selection}: {detail}{hint}\n"
    "An empty selection here is almost always a typo; check the key names."
)
_REACHED_NO_CHILDREN = "the selectors before it reached no node with children"


def _selects_nothing(
    matcher: Matcher, selection: str, detail: str = _REACHED_NO_CHILDREN, hint: str = ""
) -> LookupError:
    """The error of a naming selector that selected nothing."""
    return LookupError(
        NAMED_NOTHING_MSG.format(selector=matcher, selection=selection, detail=detail, hint=hint)
    )


def _listed(names: list[Any]) -> str:
    """The first dozen of `names`, as messages list keys."""
    return ", ".join(repr(n) for n in names[:12]) + (", ..." if len(names) > 12 else "")


def missing_key_error(key: object, node: object, row: NodeKind, where: str) -> Exception:
    """The error for a name, index or slice that matched no child of `node` (its `row`)."""
    type_name = type(node).__name__
    said = {"key": key, "where": where, "type": type_name}  # what every message names
    opened = row.open(node)
    if opened is None:
        return LookupError(LEAF_HAS_NO_CHILDREN_MSG.format(**said, leaf=describe(node)))
    entries, kind, n = opened.entries, row.kind, len(opened.entries)
    statics = row.static_names(node)
    wrapper = wrapper_of(node)
    if not entries and wrapper is not None:
        return LookupError(WRAPPER_HAS_NO_CHILDREN_MSG.format(**said, what=wrapper.what))
    if isinstance(key, str) and key in statics:
        return LookupError(STATIC_FIELD_MSG.format(**said))
    names = [entry_name(e) for e in entries]
    indexed = bool(entries) and all(type(e) is SequenceKey for e in entries)
    if isinstance(key, int) and (kind in (LIST, TUPLE, NAMEDTUPLE) or indexed):
        return IndexError(INDEX_OUT_OF_RANGE_MSG.format(**said, length=n, low=-n, high=n - 1))
    if isinstance(key, int) and names and all(isinstance(x, str) for x in names):
        return IndexError(_on_named(f"index {key}", node, names, where))
    if isinstance(key, str) and indexed and kind not in (LIST, TUPLE):
        return LookupError(INDEXED_CHILDREN_MSG.format(**said, high=n - 1))
    hint = ""
    if isinstance(key, str):
        close = closest(key, [x for x in names if isinstance(x, str)])
        if close is not None:
            hint += f"; did you mean {close!r}?"
    if names:
        hint += f"{'' if hint else '.'} Children there: {_listed(names)}."
    else:
        hint += f": a `{type_name}` with no children."
    if statics:
        hint += f" Static fields (not selectable): {_listed(list(statics))}."
    elif kind == GENERIC and isinstance(key, str) and hasattr(node, key):
        hint += (
            f" `{type_name}` has an attribute {key!r}, but it is not a child "
            "of the tree (a static field, a property or a method)."
        )
    return LookupError(f"{key!r} not found at {where}{hint}")


def _on_named(what: str, node: object, names: list[Any], where: str) -> str:
    """The message of a position (`what`) given to a node with named children."""
    first = names[0] if names else "name"
    return ON_NAMED_MSG.format(
        key=what, where=where, type=type(node).__name__, names=_listed(names), first=first
    )


def _record_statics(
    node: object, path: tuple[Any, ...], walk: Walk, matches: Callable[[Any], bool]
) -> None:
    """Note static fields a level selector would have matched (for the empty-selection error)."""
    row = row_of(node)
    if not row.static_names(node):
        return
    for name in row.static_values(node):
        if matches(GetAttrKey(name)):
            walk.record_blocked(path + (GetAttrKey(name),), "a static field")


class _SingleKeyMatcher(Matcher):
    """A name or an index: the row finds the one child without opening the node."""

    __slots__ = ("key",)
    one_key = True

    def __init__(self, key: Any) -> None:
        self.key = key

    def match(self, walk, state, node, path):
        row = row_of(node, walk.is_leaf)
        found = row.child(node, self.key)
        if found is not None:
            return ONE, (found[0], found[1], row)
        if walk.static_ok is self and self.key in row.static_names(node):
            return STATIC, self.key
        raise missing_key_error(self.key, node, row, walk.where(path))

    def __repr__(self) -> str:
        return repr(self.key)


class NameMatcher(_SingleKeyMatcher):
    """`"name"`: the attribute or dict key `name` among the children."""

    __slots__ = ()


class IndexMatcher(_SingleKeyMatcher):
    """`0`, `-1`: a sequence position (negative counts from the end), or an int dict key."""

    __slots__ = ()


def slice_text(selector: slice) -> str:
    """`0:6`, `::2`: a slice as it is written inside brackets."""
    parts = ["" if v is None else repr(v) for v in (selector.start, selector.stop)]
    text = ":".join(parts)
    return text if selector.step is None else f"{text}:{selector.step!r}"


class SliceMatcher(Matcher):
    """`start:stop:step`: the children of a sequence at those positions (as Python slices)."""

    __slots__ = ("slice",)

    def __init__(self, selector: slice) -> None:
        for part in (selector.start, selector.stop, selector.step):
            if part is not None and not isinstance(part, (int, np.integer)):
                raise TypeError(f"Slice bounds must be ints or None, got [{slice_text(selector)}].")
        if selector.step == 0:
            raise ValueError("A slice step cannot be zero.")
        self.slice = selector

    def match(self, walk, state, node, path):
        if state is not None:  # a child, picked or not at its parent
            return _YES if state else _NO
        row = row_of(node, walk.is_leaf)
        opened = row.open(node)
        if opened is None:
            raise missing_key_error(self.slice, node, row, walk.where(path))
        entries = opened.entries
        if row.kind not in (LIST, TUPLE, NAMEDTUPLE) and not all(
            type(e) is SequenceKey for e in entries
        ):
            names = [entry_name(e) for e in entries]
            raise TypeError(_on_named(f"the slice [{self!r}]", node, names, walk.where(path)))
        picked = set(range(len(entries))[self.slice])
        return ZIP, (opened, [k in picked for k in range(len(entries))])

    def __repr__(self) -> str:
        return slice_text(self.slice)


class EllipsisMatcher(Matcher):
    """`...`: every child; on a leaf, the leaf itself."""

    __slots__ = ()

    def match(self, walk, state, node, path):
        if state is not None:
            return _YES
        opened = row_of(node, walk.is_leaf).open(node)
        if opened is None:
            return _YES
        _record_statics(node, path, walk, lambda entry: True)
        return ZIP, (opened, [True] * len(opened.entries))

    def __repr__(self) -> str:
        return "..."


class EntryMatcher(Matcher):
    """A level selector that names keys: the children for which `test(selector, entry,
    child)` holds (a regex, a `BaseKey`, a key entry, a `def_rule` value). It must select
    something; static fields it matches are named when it does not (`offers_statics`; not
    for `def_rule`, whose `compare` may expect children, not fields)."""

    __slots__ = ("selector", "test", "offers_statics")
    names_something = naming = True

    def __init__(
        self, selector: Any, test: Callable[[Any, Any, Any], Any], offers_statics: bool = True
    ) -> None:
        self.selector = selector
        self.test = test
        self.offers_statics = offers_statics

    def match(self, walk, state, node, path):
        if state is not None:  # a child of the level's node
            if self.test(self.selector, path[-1], node):
                walk.hits.add(self)
                return _YES
            return _NO
        opened = row_of(node, walk.is_leaf).open(node)
        if opened is None:
            return _NO
        seen = walk.notes(self)
        if len(seen) < 64:
            seen.extend(n for n in map(entry_name, opened.entries) if n not in seen)
        if self.offers_statics:
            _record_statics(node, path, walk, lambda e: self.test(self.selector, e, None))
        return ZIP, (opened, [True] * len(opened.entries))

    def no_match_error(self, walk: Walk, selection: str) -> Exception:
        seen = walk.notes(self)
        if not seen:
            return _selects_nothing(self, selection)
        close = None
        if isinstance(self.selector, re.Pattern):  # a regex: the closest name to its pattern
            close = closest(self.selector.pattern, [str(n) for n in seen])
        hint = f"; did you mean {close!r}?" if close is not None else ""
        detail = f"no key matches it (keys there: {_listed(seen)})"
        return _selects_nothing(self, selection, detail, hint)

    def __repr__(self) -> str:
        return repr(self.selector)


def _name_matches(pattern: re.Pattern, entry: object, child: object) -> bool:
    return pattern.fullmatch(str(entry_name(entry))) is not None


def _key_equals(key: BaseKey, entry: object, child: object) -> bool:
    result = key.__eq__(entry)
    return result is not NotImplemented and bool(result)


def _same_entry(key: object, entry: object, child: object) -> bool:
    return type(entry) is type(key) and entry == key


DEF_RULE_FLAG_MSG = "`def_rule` expects `broadcastable` to be True or False, got {value!r}."


def def_rule(
    kind: type, compare: Callable[[Any, Any, Any], Any], *, broadcastable: bool = False
) -> None:
    """Make values of type `kind` selectors (sepes's `at.def_rule`): at each level, the
    children for which `compare(value, entry, child)` is true. As with a name, a rule that
    selects nothing anywhere is an error (`LookupError`); registering a type again (here or
    with `BaseKey.def_alias`) replaces what it meant.

    **Arguments**

    - `kind`: the selector type (its subclasses too). As for `BaseKey.def_alias`, types
      that are selectors already are refused (`TypeError`), except a `NamedTuple` class of
      yours (sepes's matchers often are), whose values then are this rule's matchers.
    - `compare`: `compare(value, entry, child) -> bool`.
    - `broadcastable`: accepted for sepes code, with no effect (a selected subtree always
      stands for its leaves).

    **Returns**

    None.

    ```python
    from typing import NamedTuple
    import jax, jax.numpy as jnp
    import treeclass as tc

    class Ndim(NamedTuple):
        ndim: int

    tc.at.def_rule(Ndim, lambda m, entry, child: getattr(child, "ndim", None) == m.ndim)
    tree = {"weight": jnp.ones((2, 2)), "bias": jnp.ones(2)}
    out = tc.at(tree)[Ndim(2)].apply(jnp.zeros_like)
    assert out["weight"].sum() == 0.0 and out["bias"].sum() == 2.0
    ```
    """
    if type(broadcastable) is not bool:
        raise TypeError(DEF_RULE_FLAG_MSG.format(value=broadcastable))
    if not callable(compare):
        raise TypeError(f"`def_rule` expects a callable `compare`, got {compare!r}.")
    if not isinstance(kind, type):
        raise TypeError(f"`def_rule` expects a type, got {kind!r}.")
    reason = _builtin_meaning(kind, namedtuple_ok=True)
    if reason:
        raise TypeError(RULE_BUILTIN_MSG.format(kind=_type_text(kind), reason=reason))

    # the value itself is the matcher, whatever it is (a NamedTuple is not opened as a node)
    def compile_(selector: object, where: Callable[[], str]) -> Matcher:
        return EntryMatcher(selector, compare, offers_statics=False)

    _register(kind, _UserType("a type registered with `tc.at.def_rule`", compile_))


_EACH = (EACH, True)


class TypeMatcher(Matcher):
    """A class: every node below that is an instance of it (a frozen value by the value
    inside), not looking into a match."""

    __slots__ = ("cls",)
    sees_into_frozen = True

    def __init__(self, cls: type) -> None:
        self.cls = cls

    def match(self, walk, state, node, path):
        if state is not None and (isinstance(node, self.cls) or isinstance(unwrap(node), self.cls)):
            return _YES
        return _EACH

    def __repr__(self) -> str:
        return self.cls.__name__


class WhereMatcher(Matcher):
    """`where(fn)`: every node below for which `fn(path, node)` holds (see `where`)."""

    __slots__ = ("fn",)
    sees_into_frozen = True

    def __init__(self, fn: Callable[[tuple[Any, ...], Any], Any]) -> None:
        self.fn = fn

    def match(self, walk, state, node, path):
        if state is None:
            return _EACH
        result = self.fn(path, unwrap(node))
        if result is True:
            return _YES
        if result is False or result is None:
            return _EACH
        if _is_bool_array(result) and (isinstance(result, Tracer) or result.ndim):
            return (YES, result)  # an element mask for this node's leaves
        return _YES if bool(result) else _EACH

    def __repr__(self) -> str:
        return f"where({getattr(self.fn, '__qualname__', repr(self.fn))})"


class GlobMatcher(Matcher):
    """`glob(pattern)`: nodes whose key path below the current level matches `pattern`; the
    state is the glob automaton's (the pattern positions reached at a node)."""

    __slots__ = ("glob", "accept")
    names_something = naming = True

    def __init__(self, glob_: Glob) -> None:
        self.glob = glob_
        self.accept = glob_.accept

    def advance(self, state: frozenset[int], entry: object) -> frozenset[int]:
        return self.glob.advance(state, entry_name(entry))

    def match(self, walk, state, node, path):
        if state is None:  # where the level starts
            starts = walk.notes(self)
            if len(starts) < 16:
                starts.append((node, path))
            state = self.glob.start
        else:
            state = self.glob.advance(state, entry_name(path[-1]))
            if self.accept in state:
                walk.hits.add(self)
                return _YES
            if not state:
                return _NO
        row = row_of(node, walk.is_leaf)
        opened = row.open(node)
        if opened is None:
            return _NO
        if not opened.entries:
            wrapper = wrapper_of(node)
            # the pattern goes on below a wrapped value: that stops it only if it would
            # match something inside the value (else the wrapped value is beside the point)
            if wrapper is not None and self.matches_below(state, unwrap(node)):
                walk.record_blocked(path, wrapper.role)
        if row.static_names(node):  # (most nodes have none: no note to make)
            _record_statics(node, path, walk, lambda e: self.accept in self.advance(state, e))
        return ZIP, (opened, [state] * len(opened.entries))

    def matches_below(self, state: frozenset[int], node: object) -> bool:
        """Whether the pattern at `state` matches below `node`, wrapped values looked into."""
        node = unwrap(node)
        opened = open_node(node, node_kind(node))
        if opened is None:
            return False
        for entry, child in zip(opened.entries, opened.children, strict=True):
            nxt = self.advance(state, entry)
            if self.accept in nxt or (nxt and self.matches_below(nxt, child)):
                return True
        return False

    def no_match_error(self, walk: Walk, selection: str) -> Exception:
        start = self.glob.start
        misses = [m for node, path in walk.notes(self) for m in self._misses(node, start, path)]
        if not misses:
            return _selects_nothing(self, selection)
        best = max(m[0] for m in misses)  # the furthest position the pattern failed at
        shown = sorted({str(name) for p, name, at in misses if p == best and at is None})
        # where the pattern matched so far, then found no children: (path, (node, state))
        dead_ends = [(at, name) for p, name, at in misses if p == best and at is not None]
        segments = self.glob.segments
        failing = str(segments[best])
        matched = ".".join(segments[:best]) or "(the start)"
        if shown:
            found = f"no key matches {failing!r} (keys there: {_listed(shown)})"
        else:  # no name failed there: the pattern matched all the way to childless nodes
            where, (node, state) = dead_ends[0]
            wrapper = wrapper_of(node)
            if wrapper is None:
                what = describe(node)
            elif self.matches_below(state, node):
                what = f"{wrapper.what}, which has no children: take the value out first"
            else:
                what = f"{wrapper.what}, which has no children"
            more = f" (and {len(dead_ends) - 1} more like it)" if len(dead_ends) > 1 else ""
            found = f"{walk.where(where)}{more} has no key to match {failing!r}: it is {what}"
        detail = f"after {matched}, {found}"
        hint = ""
        close = closest(failing, shown)
        if close is not None:
            fixed = [str(s) for s in segments]
            fixed[best] = close
            hint = f"; did you mean {'.'.join(fixed)!r}?"
        return _selects_nothing(self, selection, detail, hint)

    def _misses(
        self, node: object, state: frozenset[int], path: tuple[Any, ...]
    ) -> Iterator[tuple[int, Any, tuple[Any, ...] | None]]:
        """Where the pattern stops: `(position, failing name, None)`, or `(position, (node,
        state), path)` at a node with no children to match."""
        opened = row_of(node).open(node)
        if opened is None or not opened.entries:
            for p in state:
                if self.glob.expects_name(p):
                    yield p, (node, state), path
            return
        for entry, child in zip(opened.entries, opened.children, strict=True):
            nxt = self.advance(state, entry)
            for p in state:
                if self.glob.expects_name(p) and p + 1 not in nxt:
                    yield p, entry_name(entry), None
            if nxt and self.accept not in nxt:
                yield from self._misses(child, nxt, path + (entry,))

    def __repr__(self) -> str:
        return repr(self.glob)


_MASK_HOLDS = (
    "A mask holds Python bools or boolean arrays, e.g. built with "
    "`jax.tree_util.tree_map(lambda x: x > 0, tree)`."
)
MASK_LEAF_MSG = "The mask leaf at {where} is {value}, a non-bool leaf. " + _MASK_HOLDS
MASK_MISMATCH_MSG = (
    "The mask's structure does not match the tree at {where}: {reason}. A mask must have "
    "the structure of the tree it follows (or a prefix of it), with a bool or a boolean "
    "array in place of each selected leaf or subtree."
)


def _is_bool_array(x: object) -> bool:
    return isinstance(x, (jax.Array, np.ndarray)) and x.dtype == np.bool_


def mask_leaf_value(x: object) -> Any:
    """`True`/`False` for a static mask leaf, the array for an element mask, else `None`."""
    if x is True or x is False:
        return x
    if isinstance(x, np.bool_):
        return bool(x)
    return x if _is_bool_array(x) else None


def _is_other_selector(x: object) -> bool:
    if x is Ellipsis or (
        isinstance(x, (str, bytes, int, float, complex, type)) and not isinstance(x, bool)
    ):
        return True
    if isinstance(x, (re.Pattern, BaseKey, WhereMatcher, Glob, slice)):
        return True
    return type(_compiler_of(x)) is _UserType


def is_mask_like(x: object) -> bool:
    """Whether `x` is a boolean mask selector: a bool, a boolean array, or a container
    whose first level holds no other selector (a non-tuple with a bool child is one; its
    bad leaves are reported when it is used)."""
    if mask_leaf_value(x) is not None:
        return True
    if x is None or _is_other_selector(x):
        return False
    opened = open_node(x, node_kind(x))
    if opened is None:
        return False  # a leaf that is neither a bool nor a boolean array
    if type(x) is not tuple and any(mask_leaf_value(c) is not None for c in opened[1]):
        return True  # a mask with a bad leaf somewhere: the walk reports it by its path
    return not any(_is_other_selector(child) for child in opened[1])


class MaskMatcher(Matcher):
    """A boolean mask pytree, aligned with the node its level starts at.

    As the first selector that is the whole tree; after path selectors (`at[0][mask]`),
    each node they selected: a mask means the same thing wherever it sits.
    """

    __slots__ = ("mask",)

    def __init__(self, mask: object) -> None:
        self.mask = mask

    @property
    def start(self) -> Any:  # the state is the mask's subtree
        return self.mask

    def match(self, walk, state, node, path):
        if state is True:
            return _YES
        if state is False:
            return _NO
        value = mask_leaf_value(state)
        if value is not None:
            return _YES if value is True else _NO if value is False else (YES, value)
        row = row_of(node, walk.is_leaf)
        opened = row.open(node)
        if type(state) is type(node) and opened is not None:
            # fast structural checks for the common node kinds
            kind = row.kind
            if kind == LIST or kind == TUPLE:
                if len(state) == len(node):
                    return ZIP, (opened, state)
            elif kind == TREECLASS:
                if _node.child_names(state) == opened.aux:
                    return ZIP, (opened, list(_node.children(state)))
            elif kind == Kind.DICT and isinstance(opened.aux, list):
                if len(state) == len(node) and all(k in state for k in opened.aux):
                    return ZIP, (opened, [state[k] for k in opened.aux])
        mask_opened = row_of(state).open(state)
        if mask_opened is None:
            raise ValueError(
                MASK_LEAF_MSG.format(where=walk.where(path), value=describe(state, None))
            )
        if opened is None or type(state) is not type(node) or mask_opened[0] != opened[0]:
            found = first_mismatch(
                node,
                state,
                is_leaf=walk.is_leaf,
                other_covers=lambda m: mask_leaf_value(m) is not None,
            )
            if found is None:  # not expected: the checks above found a difference here
                found = Mismatch((), describe(node, opened), describe(state, mask_opened))
            where = walk.where(path + found.path)
            raise ValueError(MASK_MISMATCH_MSG.format(where=where, reason=found.explain("mask")))
        return ZIP, (opened, mask_opened[1])

    def __repr__(self) -> str:
        return f"mask({type(self.mask).__name__})"


_SKIP: Any = object()  # a union member with nothing more to say below this node
_PICKED: Any = object()  # a union member's one child (a name or an index), selected


class UnionMatcher(Matcher):
    """A tuple of selectors at one level: a node is selected when any member selects it."""

    __slots__ = ("members_", "naming")

    def __init__(self, members: tuple[Matcher, ...]) -> None:
        self.members_ = members
        self.naming = any(m.naming for m in members)

    @property
    def start(self) -> Any:  # one state per member
        return tuple(m.start for m in self.members_)

    def members(self) -> Iterator[Matcher]:
        for member in self.members_:
            yield from member.members()

    def match(self, walk, state, node, path):
        selected = False
        element_mask: Any = None
        going_on = []
        for i, (member, member_state) in enumerate(zip(self.members_, state, strict=True)):
            if member_state is _SKIP:
                continue
            if member_state is _PICKED:
                code, payload = _YES
            else:
                code, payload = member.match(walk, member_state, node, path)
            if code == YES:
                if not selected:
                    element_mask = payload
                elif element_mask is not None:  # `None` (every element) absorbs a mask
                    element_mask = (
                        None if payload is None else jnp.logical_or(element_mask, payload)
                    )
                selected = True
            elif code != NO:
                going_on.append((i, code, payload))
        if selected:
            return YES, element_mask
        zipped = [payload[0] for _, code, payload in going_on if code == ZIP]
        opened = (
            zipped[0] if zipped else row_of(node, walk.is_leaf).open(node) if going_on else None
        )
        if opened is None:
            return _NO
        # one state per child: a tuple of the members' states there
        states = [[_SKIP] * len(self.members_) for _ in opened.entries]
        for i, code, payload in going_on:
            if code == EACH:
                for member_states in states:
                    member_states[i] = payload
            elif code == ZIP:
                for member_states, member_state in zip(states, payload[1], strict=True):
                    member_states[i] = member_state
            else:  # ONE: the child a name or an index found
                states[opened.entries.index(payload[0])][i] = _PICKED
        return ZIP, (opened, [tuple(s) for s in states])

    def __repr__(self) -> str:
        return "(" + ", ".join(repr(m) for m in self.members_) + ")"


# -- compiling: a table from selector type to matcher ---------------------------------------------

SUPPORTED_SELECTORS = (
    "a str name (attribute or dict key), an int index (negative counts from the end), "
    "`...` (every child), a slice of indices (`0:6`), `re.compile(pattern)` (names "
    "matching at this level), a class "
    "(every instance at any depth), `tc.where(fn)`, `tc.glob(pattern)`, a `tc.BaseKey` "
    "instance, a key entry (`jax.tree_util.GetAttrKey`, `DictKey`, `SequenceKey`), a boolean "
    "mask (a bool, a boolean array or a pytree of them), a type registered with "
    "`tc.BaseKey.def_alias` or `tc.at.def_rule`, or a flat tuple of these (their union at one "
    "level)"
)
UNSUPPORTED_MSG = "Unsupported selector {selector} in `{where}`. Supported: {supported}.{hint}"

Compiler = Callable[[Any, Callable[[], str]], Matcher]


def _compile_union(selector: Any, where: Callable[[], str], aliased: bool = False) -> Matcher:
    """A tuple selector: one mask for a tuple tree, or the union of its members."""
    if selector and all(is_mask_like(s) for s in selector):
        return MaskMatcher(selector)  # a tuple of bools is a mask for a tuple tree
    for item in selector:
        if type(item) is tuple and not is_mask_like(item):
            raise NotImplementedError(
                UNSUPPORTED_MSG.format(
                    selector=short_repr(selector),
                    where=where(),
                    supported=SUPPORTED_SELECTORS,
                    hint=" A union is one flat tuple: .at['a', 'b'], not .at['a', ('b', 'c')].",
                )
            )
    return UnionMatcher(tuple(compile_selector(s, where, aliased) for s in selector))


@functools.lru_cache(maxsize=256)
def _glob_matcher(selector: Glob) -> Matcher:
    """One matcher per glob (`tc.glob` gives one object per pattern): each compiled once."""
    return GlobMatcher(selector)


def _compile_type(selector: type, where: Callable[[], str]) -> Matcher:
    if issubclass(selector, BaseKey):
        raise TypeError(
            f"`{selector.__name__}` is a BaseKey class; select with an instance of it: "
            f".at[{selector.__name__}(...)]."
        )
    return TypeMatcher(selector)


def _compile_entry(selector: Any, where: Callable[[], str]) -> Matcher:
    return EntryMatcher(selector, _same_entry)


_BOOL_MASKS = "boolean masks (select all or nothing)"
_ENTRIES = "key entries (the child under that key)"
# The built-in selector types: what compiles their values, and what they mean (for the
# refusals of `def_alias` and `def_rule`). Looked up along the selector type's MRO (with
# the registered `_USER_TYPES`), so subclasses (np.int64 of np.integer) follow their base.
_BUILTIN_TYPES: dict[type, tuple[Compiler, str]] = {
    str: (lambda s, where: NameMatcher(str(s)), "key names"),
    bool: (lambda s, where: MaskMatcher(bool(s)), _BOOL_MASKS),
    np.bool_: (lambda s, where: MaskMatcher(bool(s)), _BOOL_MASKS),
    int: (lambda s, where: IndexMatcher(int(s)), "sequence indices"),
    np.integer: (lambda s, where: IndexMatcher(int(s)), "sequence indices"),
    type(Ellipsis): (lambda s, where: EllipsisMatcher(), "`...` (every child)"),
    slice: (lambda s, where: SliceMatcher(s), "slices of sequence positions"),
    tuple: (_compile_union, "unions of selectors, or masks of tuple trees"),
    re.Pattern: (lambda s, where: EntryMatcher(s, _name_matches), "name patterns"),
    BaseKey: (lambda s, where: EntryMatcher(s, _key_equals), "key matchers (by their `__eq__`)"),
    WhereMatcher: (lambda s, where: s, "`tc.where` predicates"),
    Glob: (lambda s, where: _glob_matcher(s), "`tc.glob` patterns"),
    type: (_compile_type, "classes (every instance at any depth)"),
    GetAttrKey: (_compile_entry, _ENTRIES),
    DictKey: (_compile_entry, _ENTRIES),
    SequenceKey: (_compile_entry, _ENTRIES),
}
_BUILTIN: dict[type, Compiler] = {kind: compile_ for kind, (compile_, _) in _BUILTIN_TYPES.items()}
_DISPLAY_NAMES = {
    WhereMatcher: "tc.where(...)",
    Glob: "tc.glob(...)",
    _node.TreeNode: "tc.TreeClass",
    type(Ellipsis): "type(...)",
    jax.Array: "jax.Array",
    Tracer: "jax.core.Tracer",
    GetAttrKey: "jax.tree_util.GetAttrKey",
    DictKey: "jax.tree_util.DictKey",
    SequenceKey: "jax.tree_util.SequenceKey",
}
# What each built-in selector type means: those of `_BUILTIN_TYPES`, and those the mask
# fallback of `compile_selector` takes. Any other pytree node is a mask too, but its type
# cannot be told without a value, so an alias of one is refused when it is used.
_MEANINGS: dict[type, str] = {
    **{kind: meaning for kind, (_, meaning) in _BUILTIN_TYPES.items()},
    dict: "boolean masks",
    list: "boolean masks",
    type(None): "empty subtrees of boolean masks",
    jax.Array: "boolean element masks",
    Tracer: "boolean element masks (traced)",
    np.ndarray: "boolean element masks",
    _node.TreeNode: "boolean masks (a TreeClass of bools)",
}

ALIAS_BUILTIN_MSG = (
    "`tc.BaseKey.def_alias({kind})` would change what built-in selectors mean: {reason}. "
    "Built-in selectors keep their meaning; alias a type of your own, one that is not a "
    "pytree node, e.g.\n"
    "    class FieldName:\n"
    "        def __init__(self, name): self.name = name\n"
    "    tc.BaseKey.def_alias(FieldName)(lambda value: MyKey(value.name))"
)
RULE_BUILTIN_MSG = (
    "`tc.at.def_rule({kind}, compare)` would change what built-in selectors mean: {reason}. "
    "Built-in selectors keep their meaning; register a matcher type of your own (a class, "
    "or a NamedTuple), e.g.\n"
    "    class NameIs(NamedTuple):\n"
    "        name: str\n"
    "    tc.at.def_rule(NameIs, lambda m, entry, child: getattr(entry, 'name', None) == m.name)"
)
ALIAS_NODE_MSG = (
    "`tc.BaseKey.def_alias({kind})` cannot make {selector} a selector: it is a pytree node "
    "({what}), and a pytree used as a selector is a boolean mask. Alias a type that is not a "
    "pytree node."
)
ALIAS_RESULT_MSG = (
    "The converter registered with `tc.BaseKey.def_alias({kind})` returned {result} for "
    "{selector}, which is not a built-in selector{why}. A converter must return {supported}; "
    "aliases do not chain."
)


def _type_text(cls: type) -> str:
    if cls in _DISPLAY_NAMES:
        return _DISPLAY_NAMES[cls]
    module = getattr(cls, "__module__", "")
    name = getattr(cls, "__qualname__", cls.__name__)
    if module == "builtins" or not module:
        return name
    if module.startswith("treeclass."):
        return f"tc.{name}"
    return f"{module}.{name}"


def _is_subclass(cls: type, base: type) -> bool:
    try:
        return issubclass(cls, base)
    except TypeError as error:  # e.g. a `typing.Protocol` that is not runtime checkable
        raise TypeError(f"A selector type cannot be registered with {base!r}: {error}") from None


def _builtin_meaning(kind: type, *, namedtuple_ok: bool) -> str:
    """Why values of `kind` are selectors already, `""` if not (`namedtuple_ok`: def_rule)."""
    if kind in _MEANINGS:
        return f"`{_type_text(kind)}` values are {_MEANINGS[kind]}"
    namedtuple = issubclass(kind, tuple) and kind is not tuple and hasattr(kind, "_fields")
    exempt = tuple if namedtuple_ok and namedtuple else None
    for builtin, meaning in _MEANINGS.items():
        if builtin is not exempt and _is_subclass(kind, builtin):
            if _type_text(kind) == _type_text(builtin):  # `tc.TreeClass` shows as its base
                return f"`{_type_text(kind)}` values are {meaning}"
            reason = (
                f"`{_type_text(kind)}` is a subclass of `{_type_text(builtin)}`, whose values "
                f"are {meaning}"
            )
            if builtin is BaseKey:
                reason += " (an instance of a BaseKey subclass is a selector already)"
            return reason
    for builtin, meaning in _MEANINGS.items():
        if _is_subclass(builtin, kind):
            return (
                f"values of `{_type_text(builtin)}` ({meaning}) are instances of "
                f"`{_type_text(kind)}`"
            )
    return ""


class _UserType:
    """A compiler of a type registered by `def_alias` or `def_rule`, and its name (`what`)."""

    __slots__ = ("what", "compile")

    def __init__(self, what: str, compile_: Compiler) -> None:
        self.what = what
        self.compile = compile_

    def __call__(self, selector: object, where: Callable[[], str]) -> Matcher:
        return self.compile(selector, where)


# The types registered by both registries: written by `_register` (a dict store under the
# GIL, then `_compiler_for`'s cache cleared), read on indexing.
_USER_TYPES: dict[type, _UserType] = {}


def _register(kind: type, user: _UserType) -> None:
    _USER_TYPES[kind] = user
    _compiler_for.cache_clear()


@functools.lru_cache(maxsize=512)
def _compiler_for(cls: type) -> Compiler | None:
    """The compiler of `cls`'s values: the first built-in or registered type along its MRO,
    else a registered ABC."""
    for base in cls.__mro__:
        compiler: Compiler | None = _BUILTIN.get(base) or _USER_TYPES.get(base)
        if compiler is not None:
            return compiler
    for kind, found in list(_USER_TYPES.items()):  # a registered ABC
        try:
            if issubclass(cls, kind):
                return found
        except TypeError:
            continue
    return None


def _compiler_of(selector: object) -> Compiler | None:
    """The compiler of `selector`'s type, if it is a selector type."""
    try:
        return _compiler_for(type(selector))  # type: ignore[arg-type]  # mypy: a class is not Hashable
    except TypeError:  # an unhashable selector type (never, for real classes)
        return None


class _AliasResultError(Exception):
    """A converter's result is not a built-in selector: `args` are `(value, why)`."""


def _compile_alias(
    kind: type, converter: Callable[[Any], Any], selector: object, where: Callable[[], str]
) -> Matcher:
    if open_node(selector, node_kind(selector)) is not None:
        raise TypeError(
            ALIAS_NODE_MSG.format(
                kind=_type_text(kind),
                selector=short_repr(selector),
                what=describe(selector),
            )
        )
    try:
        result = converter(selector)
    except Exception as error:
        add_leaf_note(
            error, f"raised by the converter of `tc.BaseKey.def_alias({_type_text(kind)})`"
        )
        raise
    try:
        return compile_selector(result, where, aliased=True)
    except _AliasResultError as error:
        value, why = error.args
        if why:
            why = f" (it {why})" if value is result else f" (its member {short_repr(value)} {why})"
    except NotImplementedError:  # a nested tuple
        why = " (a union is one flat tuple)"
    except Exception as error:  # e.g. a BaseKey class instead of an instance
        add_leaf_note(
            error,
            f"in the selector {short_repr(result)} that the converter of "
            f"`tc.BaseKey.def_alias({_type_text(kind)})` returned",
        )
        raise
    raise TypeError(
        ALIAS_RESULT_MSG.format(
            kind=_type_text(kind),
            result=describe(result),
            selector=short_repr(selector),
            why=why,
            supported=SUPPORTED_BUILTIN,
        )
    )


SUPPORTED_BUILTIN = (
    "a str name, an int index, `...`, `re.compile(pattern)`, a class, `tc.where(fn)`, "
    "`tc.glob(pattern)`, a `tc.BaseKey` instance, a boolean mask, or a flat tuple of these"
)


NON_BOOL_MASK_MSG = (
    "Unsupported selector {selector} in `{where}`: a pytree selector (here a `{type}`) is a "
    "boolean mask, and this one has {leaf}. " + _MASK_HOLDS + "{hint}"
)


class NonBoolMaskError(NotImplementedError, ValueError):
    """A pytree selector that is not a mask: unsupported (as PyTreeClass says) and a value
    error (as a mask with a non-bool leaf found during the walk is)."""


def _non_bool_leaf(selector: object) -> str | None:
    """The first leaf of a pytree container selector that is not a bool, where and what."""
    if type(selector) is tuple or open_node(selector, node_kind(selector)) is None:
        return None
    for path, leaf in jax.tree_util.tree_flatten_with_path(selector)[0]:
        if mask_leaf_value(leaf) is None:
            return f"a non-bool leaf at {path_str(selector, path)}: {describe(leaf)}"
    return None


def compile_selector(selector: object, where: Callable[[], str], aliased: bool = False) -> Matcher:
    """The matcher for one `.at[...]` selector; `where()` shows the selection, for errors.
    `aliased`: what a `def_alias` converter returned, refused (`_AliasResultError`) unless
    a built-in selector (aliases do not chain)."""
    compiler = _compiler_of(selector)
    if aliased and type(compiler) is _UserType:
        raise _AliasResultError(selector, f"is a value of {compiler.what}")
    if compiler is _compile_union:
        return _compile_union(selector, where, aliased)
    if compiler is not None:
        return compiler(selector, where)
    if is_mask_like(selector):
        return MaskMatcher(selector)
    found = _non_bool_leaf(selector)
    if aliased:
        raise _AliasResultError(selector, "" if found is None else f"is a mask with {found}")
    hint = ""
    if isinstance(selector, list):
        hint = " For a union of keys use a tuple: .at['a', 'b']."
    elif isinstance(selector, (jax.Array, np.ndarray)):
        hint = f" An array selector must be boolean (a mask), got dtype {selector.dtype}."
    elif isinstance(selector, (float, complex)):
        hint = " Indices must be ints."
    if found is not None:
        raise NonBoolMaskError(
            NON_BOOL_MASK_MSG.format(
                selector=short_repr(selector),
                where=where(),
                type=type(selector).__name__,
                leaf=found,
                hint=hint,
            )
        )
    raise NotImplementedError(
        UNSUPPORTED_MSG.format(
            selector=describe(selector),
            where=where(),
            supported=SUPPORTED_SELECTORS,
            hint=hint,
        )
    )
