"""Looking at a pytree one node at a time: the table of node kinds, and where two part.

Every walker (`.at`, the masks, `tc.optim`, the printers, checkpoints, sharding) asks a
node's row (`NodeKind`) for its facts; docs/architecture.md describes the row. Here too:
`describe` (what a value is, for messages) and `first_mismatch` (where a second tree stops
fitting a first, its key path written from the root's class name: `MLP.layers[0].weight`).
"""

from __future__ import annotations

import builtins
import copy
import dataclasses
import enum
import functools
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

import jax
import numpy as np
from jax.tree_util import DictKey, GetAttrKey, SequenceKey

from . import _node
from ._values import array_type, entry_name, path_str, root_name, short_repr

__all__ = [
    "Kind",
    "LEAF",
    "TREECLASS",
    "DICT",
    "LIST",
    "TUPLE",
    "NAMEDTUPLE",
    "GENERIC",
    "Opened",
    "Mismatch",
    "node_kind",
    "open_node",
    "rebuild",
    "entry_name",
    "path_str",
    "root_name",
    "describe",
    "first_mismatch",
    "is_leaf_node",
    "NodeKind",
    "register_kind",
    "registered_kind",
    "row_of",
    "Wrapper",
    "Stack",
    "Display",
    "wrapper_of",
    "stack_of",
    "write_part",
    "inherited",
    "block_depths",
    "is_wrapper",
    "unwrap",
    "node_type",
    "key_text",
    "jax_children",
]


class Kind(enum.IntEnum):
    """How a node is opened and rebuilt."""

    LEAF = 0
    TREECLASS = 1
    DICT = 2
    LIST = 3
    TUPLE = 4
    NAMEDTUPLE = 5
    NONE = 6
    GENERIC = 7  # any other registered node (or, once opened, maybe a leaf)


LEAF, TREECLASS, DICT, LIST, TUPLE, NAMEDTUPLE, NONE, GENERIC = Kind

KeyEntry = Hashable  # a JAX key entry: `GetAttrKey("w")`, `DictKey("a")`, `SequenceKey(0)`
KeyPath = tuple[KeyEntry, ...]
Where = Callable[[KeyPath], str]  # how a message writes a key path (`keystr` by default)

# Exact types only: a subclass (OrderedDict, a custom list) may be registered differently.
_BUILTIN_KINDS: dict[type, Kind] = {
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


def node_kind(node: object, is_leaf: Callable[[Any], bool] | None = None) -> Kind:
    """A cheap classification of `node`; `GENERIC` may still turn out to be a leaf."""
    if is_leaf is not None and is_leaf(node):
        return LEAF
    cls = type(node)
    kind = _BUILTIN_KINDS.get(cls)
    if kind is not None:
        return kind
    if cls in _ARRAY_TYPES:
        return LEAF
    if isinstance(node, _node.TreeNode):
        return TREECLASS
    if isinstance(node, (jax.Array, np.generic)):  # tracers are jax.Array instances
        if isinstance(node, jax.Array):
            _ARRAY_TYPES.add(cls)
        return LEAF
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        return NAMEDTUPLE
    return GENERIC


class Opened(NamedTuple):
    """One node, opened: its children's key entries, the children, and what `rebuild` needs."""

    entries: tuple[KeyEntry, ...]
    children: list[Any]  # a fresh list: callers may replace items, then `rebuild`
    aux: Any


# `Opened(a, b, c)` runs a Python-level `__new__`; the walker opens every node it passes,
# so the tuple is made by the C-level constructor instead (same type, same fields)
_opened: Callable[[tuple[Any, Any, Any]], Opened] = functools.partial(tuple.__new__, Opened)


def open_node(node: object, kind: Kind) -> Opened | None:
    """The children of one node as JAX flattens it, with their key entries (`None`: a leaf)."""
    return _BY_CODE[kind].open(node)


def _open_generic(node: object) -> Opened | None:
    # one level only: every child is forced to be a leaf of this flatten
    pairs, treedef = jax.tree_util.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)
    if treedef.num_nodes == 1 and treedef.num_leaves == 1:
        return None  # not a registered node: a leaf
    return _opened((tuple(p[0] for p, _ in pairs), [c for _, c in pairs], treedef))


def rebuild(node: object, kind: Kind, aux: object, children: Sequence[Any]) -> Any:
    """`node` with its children replaced by `children` (same count and order as opened)."""
    return _BY_CODE[kind].rebuild(node, aux, children)


def is_leaf_node(node: object, is_leaf: Callable[[Any], bool] | None = None) -> bool:
    """Whether `node` is a leaf of a flatten with `is_leaf` (a childless node is not)."""
    kind = node_kind(node, is_leaf)
    return kind == LEAF or (kind == GENERIC and open_node(node, kind) is None)


# -- the table of node kinds: one row per kind of node -------------------------------------------

N = TypeVar("N")  # the type of node a row answers for
V = TypeVar("V")  # the type of value a wrapper kind holds


@dataclasses.dataclass(frozen=True)
class Wrapper(Generic[N, V]):
    """The wrapper part of a row: a node without children standing for one value."""

    mark: str  # printed before the wrapped value's text: `#` for a frozen value
    unwrap: Callable[[N], V]
    what: str  # `a frozen value`, in messages
    role: str  # its role in summaries and `tc.roles`
    maker: str  # the function that makes one, for round-trip renderings: `freeze`
    # a node like `old` (its per-instance data kept) around a new value; `None`: no way
    rewrap: Callable[[N, V], N] | None = None


@dataclasses.dataclass(frozen=True)
class Display(Generic[N]):
    """How the printers show values of one type; a field left `None` keeps the default.

    The display part of a row (`tc.PrintRule`): a kind declares its own, and
    `tc.register_printer` writes one from its keyword arguments, these fields; a display
    is found along a type's MRO.

    ```python
    import treeclass as tc

    rule = tc.PrintRule(repr=lambda v: "<secret>")
    assert rule.repr(object()) == "<secret>" and rule.count is None
    ```
    """

    # (below the `str` field, `builtins.str` names the type)
    repr: Callable[[N], str] | None = None
    str: Callable[[N], builtins.str] | None = None
    type_name: Callable[[N], builtins.str] | None = None
    count: Callable[[N], int] | None = None
    size: Callable[[N], int] | None = None
    nodestyle: Callable[[N], Mapping[builtins.str, builtins.str | int | float]] | None = None
    children: Callable[[N], Iterable[tuple[KeyEntry, Any]]] | None = None

    @property
    def has_text(self) -> bool:
        """Whether the rule gives a text: values with one print as leaves."""
        return self.repr is not None or self.str is not None

    @property
    def has_summary(self) -> bool:
        """Whether values get a summary row of their own (with `children` but no text, a
        node: its children get the rows, and `type_name` names it)."""
        if self.children is not None and not self.has_text:
            return False
        return self.has_text or any(f is not None for f in (self.type_name, self.count, self.size))


@dataclasses.dataclass(frozen=True)
class Stack(Generic[N]):
    """The stack part of a row: a node stacking blocks along its leaves' leading axes
    (layer `i` of a pattern of P layers is slot `i // P` under `<pattern>.<i % P>`)."""

    length: Callable[[N], int]  # the blocks (layers, as the unrolled model numbers them)
    unstack: Callable[[N], tuple[Any, ...]]  # the blocks, in order
    restack: Callable[[N, Sequence[Any]], N]  # a node like this one holding these blocks
    period: Callable[[N], int] = lambda node: 1  # P, for repeats of a pattern of P layers
    pattern: str | None = None  # the key the pattern's positions are under (`pattern`)
    block_axes: int = 1


Items = list[tuple[str, str, Any]]  # (label, path, child): `("w=", ".w", w)`

_no_where: Where = jax.tree_util.keystr


class NodeKind(Generic[N]):
    """One row of the table of node kinds, a registered pytree's (opened one level through
    JAX): a kind subclasses it where it differs and declares its parts (`wrapper`,
    `stack`, `display`, `mask`). Its methods and parts: docs/architecture.md."""

    kind: Kind = GENERIC  # how the matchers classify the node
    wrapper: Wrapper[N, Any] | None = None
    stack: Stack[N] | None = None
    display: Display[N] | None = None
    mask: Callable[[N], object] | None = None  # how `tc.tree_mask` masks one (else `freeze`)
    named: bool = True
    brackets: tuple[str, str] = ("(", ")")
    single_comma: bool = False  # a one-element tuple keeps its comma

    def open(self, node: N) -> Opened | None:
        return _open_generic(node)

    def child(self, node: N, key: str | int) -> tuple[KeyEntry, Any] | None:
        opened = self.open(node)
        if opened is None:
            return None
        entries = opened.entries
        position = -1 if type(key) is not int else key + len(entries) if key < 0 else key
        for k, entry in enumerate(entries):
            if selects(entry, key, k == position):
                return entry, opened.children[k]
        return None

    def replace(
        self,
        node: N,
        entry: KeyEntry,
        old: object,
        new: object,
        path: KeyPath = (),
        where: Where = _no_where,
    ) -> N:
        opened = self.open(node)
        assert opened is not None  # `child` found `old` among its children
        children = opened.children
        children[opened.entries.index(entry)] = new
        return self.rebuild(node, opened.aux, children, False, path, where)

    def rebuild(
        self,
        node: N,
        aux: Any,
        children: Sequence[Any],
        partial: bool = False,
        path: KeyPath = (),
        where: Where = _no_where,
    ) -> Any:
        return aux.unflatten(children)

    def static_names(self, node: N) -> tuple[str, ...]:
        return ()

    def static_values(self, node: N) -> dict[str, Any]:
        return {}

    def with_static(self, node: N, name: str, value: object) -> N:
        raise LookupError(f"a `{type(node).__name__}` has no static part {name!r}")

    def items(self, node: N, hidden: bool) -> Items | None:
        shown = None if self.display is None else self.display.children
        pairs = jax_children(node) if shown is None else shown(node)
        return None if pairs is None else [(*key_text(key), child) for key, child in pairs]

    def type_name(self, node: N) -> str:
        # a display's `type_name` names a node only with its `children`
        display = self.display
        if display is None or display.children is None or display.type_name is None:
            return type(node).__name__
        return display.type_name(node)

    def roles_of(self, node: N) -> object | None:
        return None


def selects(entry: Any, key: str | int, at_index: bool) -> bool:
    """Whether the child under `entry` (`at_index`: the child at index `key`) is the one a
    name or an index `key` selects; an int dict key, never a bool one."""
    cls = type(entry)
    if type(key) is str:
        if cls is GetAttrKey:
            return entry.name == key
        if cls is DictKey:
            return entry.key == key
        return entry_name(entry) == key
    if cls is SequenceKey or cls is jax.tree_util.FlattenedIndexKey:
        return at_index
    if cls is DictKey:
        return type(entry.key) is not bool and entry.key == key
    if cls is GetAttrKey:
        return False
    return entry_name(entry) == key


class _LeafKind(NodeKind[object]):
    kind = LEAF

    def open(self, node: object) -> Opened | None:
        return None

    def items(self, node: object, hidden: bool) -> Items | None:
        return None


class _NoneKind(_LeafKind):
    kind = NONE

    def open(self, node: object) -> Opened | None:
        return _opened(((), [], None))

    def rebuild(self, node: object, aux: object, children: Sequence, *_: Any, **__: Any) -> Any:
        return node


_NOTHING = _node.NOTHING
_TreeNode = _node.TreeNode
_tc_child = _node.child
_replace_child = _node.replace_child


class _TreeClassKind(NodeKind[_TreeNode]):
    kind = TREECLASS

    def open(self, node: _TreeNode) -> Opened | None:
        return _opened(_node.opened(node))

    def child(self, node: _TreeNode, key: str | int) -> tuple[KeyEntry, Any] | None:
        if type(key) is str:
            found = _tc_child(node, key)
            if found is not _NOTHING:
                return GetAttrKey(key), found
        return None

    def replace(self, node: _TreeNode, entry: Any, old: Any, new: Any, *_: Any, **__: Any) -> Any:
        # same names, so the same layout: a cheap copy with one child replaced
        return _replace_child(node, entry.name, new)

    def rebuild(
        self, node: _TreeNode, aux: Any, children: Sequence[Any], *_: Any, **__: Any
    ) -> Any:
        return _node.rebuild(node, children)

    def static_names(self, node: _TreeNode) -> tuple[str, ...]:
        return _node.static_names(type(node))

    def static_values(self, node: _TreeNode) -> dict[str, Any]:
        return _node.static_values(node)

    def with_static(self, node: _TreeNode, name: str, value: object) -> _TreeNode:
        # through `setattr` on an unsealed copy: the field's `on_setattr` callbacks run,
        # and the copy is sealed with the layout of its new static values
        copy = _node.replace_children(node, {})
        _node.unseal(copy)
        try:
            setattr(copy, name, value)
        finally:
            _node.seal(copy)
        return copy

    def items(self, node: _TreeNode, hidden: bool) -> Items:
        # every attribute in order, static fields too: the one display opening of a TreeClass
        fields = _node.fields_of(type(node))
        return [
            (f"{name}=", f".{name}", value)
            for name, value in _node.attributes(node).items()
            if hidden or name not in fields or fields[name].repr
        ]

    def roles_of(self, node: _TreeNode) -> object | None:
        return node


class _DictKind(NodeKind[dict]):
    kind = DICT
    named = False
    brackets = ("{", "}")

    def open(self, node: dict) -> Opened | None:
        try:
            keys = sorted(node)  # the order jax flattens a dict in
        except TypeError:
            return _open_generic(node)
        return _opened((tuple(DictKey(k) for k in keys), [node[k] for k in keys], keys))

    def rebuild(self, node: dict, aux: Any, children: Sequence[Any], *_: Any, **__: Any) -> Any:
        if not isinstance(aux, list):  # keys that do not sort: opened by JAX
            return aux.unflatten(children)
        new = dict(node)  # keeps the caller's insertion order
        for key, child in zip(aux, children, strict=True):
            new[key] = child
        return new

    def child(self, node: dict, key: str | int) -> tuple[KeyEntry, Any] | None:
        try:
            found = key in node
        except TypeError:  # an unhashable key cannot be in the dict
            return None
        return (DictKey(key), node[key]) if found else None

    def replace(self, node: dict, entry: Any, old: Any, new: Any, *_: Any, **__: Any) -> dict:
        out = dict(node)
        out[entry.key] = new
        return out

    def items(self, node: dict, hidden: bool) -> Items:
        return [(f"{k!r}: ", f"[{k!r}]", v) for k, v in node.items()]  # in insertion order


_Sequence = list[Any] | tuple[Any, ...]


class _SequenceKind(NodeKind[_Sequence]):
    named = False

    def __init__(self, kind: Kind) -> None:
        self.kind = kind
        self.single_comma = kind == TUPLE
        self.brackets = ("[", "]") if kind == LIST else ("(", ")")

    def open(self, node: _Sequence) -> Opened | None:
        return _opened((tuple(SequenceKey(i) for i in range(len(node))), list(node), None))

    def rebuild(
        self, node: _Sequence, aux: Any, children: Sequence[Any], *_: Any, **__: Any
    ) -> Any:
        return list(children) if self.kind == LIST else tuple(children)

    def child(self, node: _Sequence, key: str | int) -> tuple[KeyEntry, Any] | None:
        if type(key) is not int:
            return None
        n = len(node)
        index = key + n if key < 0 else key
        return (SequenceKey(index), node[index]) if 0 <= index < n else None

    def replace(self, node: _Sequence, entry: Any, old: Any, new: Any, *_: Any, **__: Any) -> Any:
        items = list(node)
        items[entry.idx] = new
        return items if self.kind == LIST else tuple(items)

    def items(self, node: _Sequence, hidden: bool) -> Items:
        return [("", f"[{i}]", v) for i, v in enumerate(node)]


class _Named(Protocol):
    """What the named-tuple row uses of a `collections.namedtuple` / `typing.NamedTuple`."""

    _fields: tuple[str, ...]

    def _make(self, iterable: Iterable[object]) -> _Named: ...
    def _replace(self, **changes: object) -> _Named: ...
    def __iter__(self) -> Iterator[object]: ...
    def __getitem__(self, index: int) -> object: ...


class _NamedTupleKind(NodeKind[_Named]):
    kind = NAMEDTUPLE

    def open(self, node: _Named) -> Opened | None:
        # not jax's one-level flatten, which gives every namedtuple child the first key
        return _opened((tuple(GetAttrKey(f) for f in node._fields), list(node), None))

    def rebuild(self, node: _Named, aux: Any, children: Sequence[Any], *_: Any, **__: Any) -> Any:
        return node._make(children)

    def child(self, node: _Named, key: str | int) -> tuple[KeyEntry, Any] | None:
        fields = node._fields
        if type(key) is str and key in fields:
            index = fields.index(key)
        elif type(key) is int and -len(fields) <= key < len(fields):
            index = key % len(fields)
        else:
            return None
        return GetAttrKey(fields[index]), node[index]

    def replace(self, node: _Named, entry: Any, old: Any, new: Any, *_: Any, **__: Any) -> _Named:
        return node._replace(**{entry.name: new})


LEAF_KIND = _LeafKind()
TREECLASS_KIND = _TreeClassKind()
GENERIC_KIND: NodeKind[object] = NodeKind()
_NAMEDTUPLE_KIND = _NamedTupleKind()
_BY_CODE: dict[Kind, NodeKind] = {
    LEAF: LEAF_KIND,
    TREECLASS: TREECLASS_KIND,
    DICT: _DictKind(),
    LIST: _SequenceKind(LIST),
    TUPLE: _SequenceKind(TUPLE),
    NAMEDTUPLE: _NAMEDTUPLE_KIND,
    NONE: _NoneKind(),
    GENERIC: GENERIC_KIND,
}
# Rows by exact type: the builtin containers, the kinds registered by their modules, and
# the types the public adapters wrote a part for (`write_part`); read lock-free, one dict
# lookup per node on the walker's path. `_MADE`: the types whose rows `write_part` made.
# `_INHERITED`: parts found along a type's MRO, a fresh dict after each write (a reader
# fills the one it read).
_KINDS: dict[type, NodeKind] = {
    cls: _BY_CODE[code] for cls, code in _BUILTIN_KINDS.items() if code != LEAF
}
_MADE: set[type] = set()
_INHERITED: dict[tuple[type, str], Any] = {}


def register_kind(cls: type, row: NodeKind) -> None:
    """Make `row` the row of nodes of exactly type `cls` (registered with JAX too), once,
    in the module that defines the kind."""
    global _INHERITED
    if not isinstance(row, NodeKind):
        raise TypeError(f"a row of the table of node kinds is a `NodeKind`, got {row!r}")
    _KINDS[cls] = row
    _INHERITED = {}


# `registered_kind(cls)`: the row registered for nodes of exactly type `cls`, or `None`
# (the table's own `get`: a C-level call, for the walker's fast path)
registered_kind: Callable[[type], NodeKind | None] = _KINDS.get


def row_of(node: object, is_leaf: Callable[[Any], bool] | None = None) -> NodeKind:
    """The row of `node` for walkers (`LEAF_KIND` for what `is_leaf` stops at)."""
    if is_leaf is not None and is_leaf(node):
        return LEAF_KIND
    row = _KINDS.get(type(node))
    if row is not None:
        return row
    if isinstance(node, _node.TreeNode):  # before the other tests: the most common node
        return TREECLASS_KIND
    return _BY_CODE[node_kind(node)]


def wrapper_of(node: object) -> Wrapper | None:
    """The wrapper part of `node`'s row (a frozen value's), or `None`."""
    row = _KINDS.get(type(node))
    return None if row is None else row.wrapper


def unwrap(node: object) -> Any:
    """The value inside `node` when it is of a wrapper kind, else `node` itself."""
    row = _KINDS.get(type(node))
    return node if row is None or row.wrapper is None else row.wrapper.unwrap(node)


def is_wrapper(node: object) -> bool:
    """Whether `node` is of a wrapper kind: an `is_leaf` that keeps frozen values whole."""
    row = _KINDS.get(type(node))
    return row is not None and row.wrapper is not None


def stack_of(node: object) -> Stack[Any] | None:
    """The stack part of `node`'s row (a `Stacked`'s), or `None`."""
    row = _KINDS.get(type(node))
    return None if row is None else row.stack


def block_depths(tree: object, depth: int = 0) -> list[int]:
    """For every leaf of `tree`, in flatten order, the leading block axes the stacks above
    it add (each stack's `Stack.block_axes`)."""
    out: list[int] = []
    for x in jax.tree_util.tree_leaves(tree, is_leaf=lambda x: stack_of(x) is not None):
        stack = stack_of(x)
        if stack is None:
            out.append(depth)
            continue
        for _, child in jax_children(x) or ():
            out.extend(block_depths(child, depth + stack.block_axes))
    return out


# -- how the printers show each kind of node ---------------------------------------------------


def key_text(entry: KeyEntry) -> tuple[str, str]:
    """`(label, path)` of a JAX key entry as printed: `("w=", ".w")`, `("'a': ", "['a']")`."""
    name = entry_name(entry)
    if isinstance(entry, GetAttrKey):
        return f"{name}=", f".{name}"
    if isinstance(entry, DictKey):
        return f"{name!r}: ", f"[{name!r}]"
    if isinstance(entry, SequenceKey | jax.tree_util.FlattenedIndexKey):
        return "", f"[{name}]"
    return "", str(entry)


def jax_children(node: object) -> list[tuple[Any, Any]] | None:
    """`node`'s `(key entry, child)` pairs one level down as JAX flattens it; `None`: a leaf."""
    opened = open_node(node, node_kind(node))
    return None if opened is None else list(zip(opened.entries, opened.children, strict=True))


class _DictSubclassKind(NodeKind[dict]):
    brackets = ("({", "})")
    items = _DictKind.items


class _DataclassKind(NodeKind[Any]):
    def items(self, node: Any, hidden: bool) -> Items:
        return [
            (f"{f.name}=", f".{f.name}", getattr(node, f.name))
            for f in dataclasses.fields(node)
            if (hidden or f.repr) and hasattr(node, f.name)
        ]


def _is_partial(node: Any, of_type: bool = False) -> bool:
    """`functools.partial`, `jax.tree_util.Partial`, `tc.Partial` and look-alikes."""
    if _is(node, of_type, functools.partial):
        return True
    if of_type:
        return all(hasattr(node, name) for name in ("func", "args", "keywords"))
    try:
        return (
            callable(getattr(node, "func", None))
            and isinstance(node.args, tuple)
            and isinstance(node.keywords, dict)
        )
    except Exception:
        return False


class _PartialKind(NodeKind[functools.partial]):
    def items(self, node: functools.partial, hidden: bool) -> Items:
        # from the object: a registered partial keeps its function in the aux data
        items = [("", ".func", node.func)]
        items += [("", f".args[{i}]", arg) for i, arg in enumerate(node.args)]
        return items + [(f"{k}=", f".keywords[{k!r}]", v) for k, v in node.keywords.items()]


class _SequenceSubclassKind(NodeKind[_Sequence]):
    items = _SequenceKind.items


# Rows only the printers ask for, by the first test a node passes (`test(node, False)`;
# `test(cls, True)`: for every node of type `cls`): a dataclass, a partial, subclasses.
_BY_TEST: tuple[tuple[Callable[[Any, bool], bool], NodeKind], ...] = (
    (lambda x, of_type: _is(x, of_type, dict), _DictSubclassKind()),
    (
        lambda x, of_type: dataclasses.is_dataclass(x) and (of_type or not isinstance(x, type)),
        _DataclassKind(),
    ),
    (_is_partial, _PartialKind()),
    (lambda x, of_type: _is(x, of_type, (list, tuple)), _SequenceSubclassKind()),
)


def _is(x: Any, of_type: bool, cls: type | tuple[type, ...]) -> bool:
    return issubclass(x, cls) if of_type else isinstance(x, cls)


def node_type(node: object, kind: Kind | None = None) -> NodeKind | None:
    """The row that shows `node` (of walker kind `kind`); `None`: it prints as a leaf
    (a leaf, `None`, or a value of a wrapper kind, shown as its mark and value)."""
    row = _KINDS.get(type(node))
    if row is None:
        kind = node_kind(node) if kind is None else kind
        tested = (row for test, row in _BY_TEST if test(node, False))
        row = _BY_CODE[kind] if kind is not GENERIC else next(tested, GENERIC_KIND)
    return None if row.wrapper is not None or row.kind in (LEAF, NONE) else row


def _class_row(cls: type) -> NodeKind:
    """The row that `row_of` and `node_type` give every node of type `cls` that has none."""
    code = _BUILTIN_KINDS.get(cls)
    if code is not None:
        return _BY_CODE[code]
    if issubclass(cls, _node.TreeNode):
        return TREECLASS_KIND
    if issubclass(cls, (jax.Array, np.generic)):
        return LEAF_KIND
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        return _NAMEDTUPLE_KIND
    return next((row for test, row in _BY_TEST if test(cls, True)), GENERIC_KIND)


def write_part(cls: type, part: str, value: object) -> None:
    """Set the part `part` of the row of exactly type `cls` (`None`: back to its kind's
    own), in a copy of its row (or of the row its nodes have): how `tc.register_printer`,
    `tc.tree_mask.def_type` and `tc.tree_unmask.def_type` write."""
    global _INHERITED
    row = copy.copy(_KINDS.get(cls) or _class_row(cls))
    if value is None:
        vars(row).pop(part, None)
    else:
        setattr(row, part, value)
    made = cls in _MADE or cls not in _KINDS
    if made and not vars(row):  # no part left: the type has no row of its own again
        _KINDS.pop(cls, None)
        _MADE.discard(cls)
    else:
        if made:
            _MADE.add(cls)
        _KINDS[cls] = row
    _INHERITED = {}


def inherited(cls: type, part: str) -> Any:
    """The part `part` of the row of `cls` or of its nearest base class that has one."""
    found = _INHERITED
    key = (cls, part)
    try:
        return found[key]
    except KeyError:
        pass
    rows = (_KINDS.get(base) for base in cls.__mro__)
    parts = (getattr(row, part) for row in rows if row is not None)
    value = next((v for v in parts if v is not None), None)
    found[key] = value
    return value


# -- where two structures part ---------------------------------------------------------------

_UNOPENED: Any = object()


def describe(x: object, opened: Opened | None = _UNOPENED) -> str:
    r"""What `x` is, in a few words, for messages: the one description of a value.

    `an array f32[2,3]`, `1.0 (a \`float\`)`, `a frozen value (an array f32[2])`, `a
    \`dict\` with children ('a', 'b')`, `a \`Foo\` node without children`. A node is
    described by its children as JAX flattens it (`opened`, when the caller has it).
    """
    wrapper = wrapper_of(x)
    if wrapper is not None:
        return f"{wrapper.what} ({describe(wrapper.unwrap(x))})"
    if x is None:
        return "None"
    if opened is _UNOPENED:
        kind = node_kind(x)
        opened = None if kind == LEAF else open_node(x, kind)
    if opened is None:
        if isinstance(x, np.generic):  # a number, though it has a shape and a dtype
            return f"{short_repr(x)} (a `numpy.{type(x).__name__}`)"
        shape, dtype = getattr(x, "shape", None), getattr(x, "dtype", None)
        if shape is not None and dtype is not None:
            return f"an array {array_type(dtype, tuple(shape))}"
        return f"{short_repr(x)} ({_a(type(x).__name__)})"
    if not opened.entries:
        return f"{_a(type(x).__name__)} node without children"
    names = ", ".join(repr(entry_name(e)) for e in opened.entries)
    return f"{_a(type(x).__name__)} with children ({names})"


def _a(name: str) -> str:
    """A type name with the article it is read with: a `Foo`, an `int`."""
    # 'u' reads as 'you' in the type names met here (`uint8`, `UUID`): a consonant
    return f"{'an' if name[:1].lower() in 'aeio' else 'a'} `{name}`"


def _side(x: object, opened: Opened | None) -> str:
    """One side of a mismatch: a leaf says so (`a leaf, an array f32[2]`)."""
    text = describe(x, opened)
    return f"a leaf, {text}" if opened is None and wrapper_of(x) is None else text


class Mismatch(NamedTuple):
    """Where a second tree stops fitting a first: the key path and what each has there."""

    path: KeyPath
    tree_has: str
    other_has: str
    only_tree: tuple[str, ...] = ()  # key entries (as `keystr` text) only the tree has
    only_other: tuple[str, ...] = ()  # and only the other has

    def explain(self, other: str, tree: str = "tree") -> str:
        """`the tree has ..., the <other> has ...; missing in the <other>: ...`."""
        verb = "have" if tree.endswith("s") else "has"
        text = f"the {tree} {verb} {self.tree_has}, the {other} has {self.other_has}"
        if self.only_tree:
            text += f"; missing in the {other}: {', '.join(self.only_tree)}"
        if self.only_other:
            text += f"; not in the {tree}: {', '.join(self.only_other)}"
        return text


def first_mismatch(
    tree: object,
    other: object,
    *,
    is_leaf: Callable[[Any], bool] | None = None,
    other_covers: Callable[[Any], bool] | None = None,
    path: tuple[Any, ...] = (),
) -> Mismatch | None:
    """The first place (in flatten order) where `other` stops having `tree`'s structure (node
    types, key entries, static data, down to `tree`'s leaves split by `is_leaf`), or `None`.
    A node of `other` that `other_covers` accepts stands for `tree`'s whole subtree there
    (a prefix: a mask's `True`, a label); without it, leaves must meet exactly."""
    tree_kind = node_kind(tree, is_leaf)
    tree_opened = None if tree_kind == LEAF else open_node(tree, tree_kind)
    if other_covers is not None and other_covers(other):
        return None
    other_kind = node_kind(other)
    other_opened = None if other_kind == LEAF else open_node(other, other_kind)
    if tree_opened is None or other_opened is None or type(tree) is not type(other):
        # leaf against leaf: `is_leaf` splits `other` too (a frozen value against a frozen one)
        if tree_opened is None and other_covers is None:
            if other_opened is None or (is_leaf is not None and is_leaf(other)):
                return None
        return Mismatch(path, _side(tree, tree_opened), _side(other, other_opened))
    if tree_opened.entries != other_opened.entries:
        t = [jax.tree_util.keystr((e,)) for e in tree_opened.entries]
        o = [jax.tree_util.keystr((e,)) for e in other_opened.entries]
        only = tuple(k for k in t if k not in o), tuple(k for k in o if k not in t)
        return Mismatch(path, _side(tree, tree_opened), _side(other, other_opened), *only)
    for entry, t, o in zip(
        tree_opened.entries, tree_opened.children, other_opened.children, strict=True
    ):
        found = first_mismatch(
            t, o, is_leaf=is_leaf, other_covers=other_covers, path=path + (entry,)
        )
        if found is not None:
            return found
    if jax.tree_util.tree_structure(tree, is_leaf=lambda x: x is not tree) != (
        jax.tree_util.tree_structure(other, is_leaf=lambda x: x is not other)
    ):
        what = f"a `{type(tree).__name__}`"
        return Mismatch(
            path,
            f"{what} with other static data (static fields, frozen values)",
            f"{what} with the same children but different static data",
        )
    return None
