"""Looking at a pytree one node at a time: kinds, opening, rebuilding, and where two part.

Everything in treeclass that walks a tree level by level (the `.at` walker and its
matchers, the mask checks of `tree_mask` and `tc.optim`, the printers) opens a node here,
so there is one answer to "what are this node's children and their key entries", and one
explanation of where a mask, a value or a label tree stops fitting a tree, with one way
of writing the key path in messages: the root's class name (`MLP.layers[0].weight`), or
`tree` when the root is a dict, list or tuple.

Walkers open and rebuild a node as JAX flattens it (`node_kind`, `open_node`, `rebuild`);
the printers show it through the table of node types (`node_type`, one `NodeType` row
per kind of node: its shown children, how their keys read, its brackets), which also
opens what JAX keeps whole (a plain dataclass, a `functools.partial`).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.tree_util import DictKey, GetAttrKey, SequenceKey

from . import _node
from ._frozen import Frozen, unfreeze
from ._values import entry_name, path_str, root_name, short_repr

__all__ = [
    "Kind",
    "LEAF",
    "TREECLASS",
    "DICT",
    "LIST",
    "TUPLE",
    "NAMEDTUPLE",
    "NONE",
    "GENERIC",
    "Opened",
    "Mismatch",
    "node_kind",
    "open_node",
    "rebuild",
    "entry_name",
    "child_by_entry",
    "path_str",
    "root_name",
    "describe",
    "first_mismatch",
    "is_leaf_node",
    "Wrapper",
    "wrapper_of",
    "NodeType",
    "node_type",
    "key_text",
    "named",
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


def node_kind(node: Any, is_leaf: Callable[[Any], bool] | None = None) -> Kind:
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

    entries: tuple[Any, ...]
    children: list[Any]  # a fresh list: callers may replace items, then `rebuild`
    aux: Any


# `Opened(a, b, c)` runs a Python-level `__new__`; the walker opens every node it passes,
# so the tuple is made by the C-level constructor instead (same type, same fields)
_opened: Callable[[tuple[Any, Any, Any]], Opened] = functools.partial(tuple.__new__, Opened)


def open_node(node: Any, kind: Kind) -> Opened | None:
    """The children of one node with their key entries, or `None` for a leaf."""
    if kind == TREECLASS:
        return _opened(_node.opened(node))
    if kind == DICT:
        try:
            keys = sorted(node)  # the order jax flattens a dict in
        except TypeError:
            return _open_generic(node)
        return _opened((tuple(DictKey(k) for k in keys), [node[k] for k in keys], keys))
    if kind == LIST or kind == TUPLE:
        return _opened((tuple(SequenceKey(i) for i in range(len(node))), list(node), None))
    if kind == NAMEDTUPLE:
        # not jax's one-level flatten, which gives every namedtuple child the first key
        return _opened((tuple(GetAttrKey(f) for f in type(node)._fields), list(node), None))
    if kind == NONE:
        return _opened(((), [], None))
    if kind == LEAF:
        return None
    return _open_generic(node)


def _open_generic(node: Any) -> Opened | None:
    # one level only: every child is forced to be a leaf of this flatten
    pairs, treedef = jax.tree_util.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)
    if treedef.num_nodes == 1 and treedef.num_leaves == 1:
        return None  # not a registered node: a leaf
    return _opened((tuple(p[0] for p, _ in pairs), [c for _, c in pairs], treedef))


def rebuild(node: Any, kind: Kind, aux: Any, children: Sequence[Any]) -> Any:
    """`node` with its children replaced by `children` (same count and order as opened)."""
    if kind == TREECLASS:
        return _node.rebuild(node, children)
    if kind == DICT:
        if isinstance(aux, list):
            new = dict(node)  # keeps the caller's insertion order
            for key, child in zip(aux, children, strict=True):
                new[key] = child
            return new
        return aux.unflatten(children)
    if kind == LIST:
        return list(children)
    if kind == TUPLE:
        return tuple(children)
    if kind == NAMEDTUPLE:
        return node._make(children)
    if kind == NONE:
        return node
    return aux.unflatten(children)


def is_leaf_node(node: Any, is_leaf: Callable[[Any], bool] | None = None) -> bool:
    """Whether `node` is a leaf of a flatten with `is_leaf` (a childless node is not)."""
    kind = node_kind(node, is_leaf)
    return kind == LEAF or (kind == GENERIC and open_node(node, kind) is None)


def child_by_entry(node: Any, entry: Any) -> tuple[bool, Any]:
    """`(found, child)`: the child of `node` under key `entry` (jax structure only).

    A direct lookup for the kinds whose entries name their children (attributes, dict
    keys, sequence indices), so a walk that looks up one child per node costs the depth,
    not the size of every node on the way; other nodes are opened and searched.
    """
    kind = node_kind(node)
    cls = type(entry)
    if kind == TREECLASS and cls is GetAttrKey:
        found = _node.child(node, entry.name)
        return (found is not _node.NOTHING), (None if found is _node.NOTHING else found)
    if kind == DICT and cls is DictKey:
        try:
            return (True, node[entry.key]) if entry.key in node else (False, None)
        except TypeError:  # an unhashable key cannot be in the dict
            return False, None
    if (kind == LIST or kind == TUPLE) and cls is SequenceKey:
        index = entry.idx
        return (True, node[index]) if 0 <= index < len(node) else (False, None)
    opened = open_node(node, kind)
    if opened is None:
        return False, None
    for e, c in zip(opened.entries, opened.children, strict=True):
        if e == entry:
            return True, c
    return False, None


# -- wrappers: nodes without children that stand for one value ----------------------------------


class Wrapper(NamedTuple):
    """A node kind that wraps one value in a node without children (a frozen value).

    The printers show a wrapped value as `mark` + the value's own text, the summaries
    count the value inside, and messages call it `what`. A new wrapper kind is one entry
    of `_WRAPPERS`; nothing else in the package branches on it.
    """

    mark: str  # printed before the wrapped value's text: `#` for a frozen value
    unwrap: Callable[[Any], Any]
    what: str  # `a frozen value`, in messages
    role: str  # its role in summaries
    maker: str  # the function that makes one, for round-trip renderings: `freeze`


_WRAPPERS: dict[type, Wrapper] = {
    Frozen: Wrapper("#", unfreeze, "a frozen value", "frozen", "freeze"),
}


def wrapper_of(node: Any) -> Wrapper | None:
    """The wrapper entry of `node`'s kind, or `None` when `node` is no wrapper."""
    return _WRAPPERS.get(type(node))


# -- the table of node types: how the printers show each kind of node ------------------------

Items = list[tuple[str, str, Any]]  # (label, path, child): `("w=", ".w", w)`


def key_text(entry: Any) -> tuple[str, str]:
    """`(label, path)` of a JAX key entry as printed: `("w=", ".w")`, `("'a': ", "['a']")`."""
    if isinstance(entry, GetAttrKey):
        return f"{entry.name}=", f".{entry.name}"
    if isinstance(entry, DictKey):
        return f"{entry.key!r}: ", f"[{entry.key!r}]"
    if isinstance(entry, SequenceKey):
        return "", f"[{entry.idx}]"
    if isinstance(entry, jax.tree_util.FlattenedIndexKey):
        return "", f"[{entry.key}]"
    return "", str(entry)


def named(pairs: Iterable[tuple[Any, Any]] | None) -> Items | None:
    """`(key entry, child)` pairs as `(label, path, child)` items (`key_text`)."""
    return None if pairs is None else [(*key_text(key), child) for key, child in pairs]


def jax_children(node: Any) -> list[tuple[Any, Any]] | None:
    """`node`'s `(key entry, child)` pairs one level down as JAX flattens it; `None`: a leaf."""
    opened = open_node(node, node_kind(node))
    return None if opened is None else list(zip(opened.entries, opened.children, strict=True))


class NodeType(NamedTuple):
    """One row of the table of node types: how the printers show one kind of node.

    `items(node, hidden)`: the children shown, each with the texts naming its key,
    `("w=", ".w", w)` or `("", "[0]", x)` (`hidden`: also `repr=False` fields), or `None`
    to show the node as a leaf. `type_name(node)` names it in diagrams and summaries; it
    prints between `brackets`, after its type name when `named`.
    """

    items: Callable[[Any, bool], Items | None]
    named: bool = True
    brackets: tuple[str, str] = ("(", ")")
    type_name: Callable[[Any], str] = lambda node: type(node).__name__
    single_comma: bool = False  # a one-element tuple keeps its comma


def _treeclass_items(node: Any, hidden: bool) -> Items:
    # every attribute in order, static fields too: the one display opening of a TreeClass
    fields = _node.fields_of(type(node))
    return [
        (f"{name}=", f".{name}", value)
        for name, value in _node.attributes(node).items()
        if hidden or name not in fields or fields[name].repr
    ]


def _dataclass_items(node: Any, hidden: bool) -> Items:
    return [
        (f"{f.name}=", f".{f.name}", getattr(node, f.name))
        for f in dataclasses.fields(node)
        if (hidden or f.repr) and hasattr(node, f.name)
    ]


def _is_partial(node: Any) -> bool:
    """`functools.partial`, `jax.tree_util.Partial`, `tc.Partial` and look-alikes."""
    if isinstance(node, functools.partial):
        return True
    try:
        return (
            callable(getattr(node, "func", None))
            and isinstance(node.args, tuple)
            and isinstance(node.keywords, dict)
        )
    except Exception:
        return False


def _partial_items(node: Any, hidden: bool) -> Items:
    # from the object: a registered partial keeps its function in the aux data
    items = [("", ".func", node.func)]
    items += [("", f".args[{i}]", arg) for i, arg in enumerate(node.args)]
    return items + [(f"{k}=", f".keywords[{k!r}]", v) for k, v in node.keywords.items()]


def _dict_items(node: Any, hidden: bool) -> Items:
    return [(f"{k!r}: ", f"[{k!r}]", v) for k, v in node.items()]  # in insertion order


def _sequence_items(node: Any, hidden: bool) -> Items:
    return [("", f"[{i}]", v) for i, v in enumerate(node)]


# rows by the walker's kind; `LEAF` and `NONE` print as leaves
_BY_KIND: dict[Kind, NodeType] = {
    TREECLASS: NodeType(_treeclass_items),
    DICT: NodeType(_dict_items, named=False, brackets=("{", "}")),
    LIST: NodeType(_sequence_items, named=False, brackets=("[", "]")),
    TUPLE: NodeType(_sequence_items, named=False, single_comma=True),
    NAMEDTUPLE: NodeType(
        lambda node, hidden: [(f"{f}=", f".{f}", v) for f, v in zip(node._fields, node)]
    ),
}
# the other nodes, by the first test they pass (a wrapper prints as its mark and value)
_BY_TEST: tuple[tuple[Callable[[Any], bool], NodeType | None], ...] = (
    (lambda node: type(node) in _WRAPPERS, None),
    (lambda node: isinstance(node, dict), NodeType(_dict_items, brackets=("({", "})"))),
    (
        lambda node: dataclasses.is_dataclass(node) and not isinstance(node, type),
        NodeType(_dataclass_items),
    ),
    (_is_partial, NodeType(_partial_items)),
    (lambda node: isinstance(node, (list, tuple)), NodeType(_sequence_items)),
)
# any other registered node: its children as JAX flattens it
_GENERIC = NodeType(lambda node, hidden: named(jax_children(node)))


def node_type(node: Any, kind: Kind) -> NodeType | None:
    """The row of the table that shows `node` (of walker kind `kind`); `None`: a leaf."""
    if kind is not GENERIC:
        return _BY_KIND.get(kind)
    for test, row in _BY_TEST:
        if test(node):
            return row
    return _GENERIC


# -- where two structures part ---------------------------------------------------------------


def describe(node: Any, opened: Opened | None) -> str:
    """A short description of a node for messages: what is there, and its children."""
    wrapper = _WRAPPERS.get(type(node))
    if wrapper is not None:
        return f"{wrapper.what} ({short_repr(node)})"
    if opened is None:
        shape, dtype = getattr(node, "shape", None), getattr(node, "dtype", None)
        if shape is not None and dtype is not None:
            return f"a leaf, an array {dtype}{list(shape)}"
        return f"a leaf {short_repr(node)} of type {type(node).__name__}"
    if not opened.entries:
        return f"a `{type(node).__name__}` node without children"
    names = ", ".join(repr(entry_name(e)) for e in opened.entries)
    return f"a `{type(node).__name__}` with children ({names})"


class Mismatch(NamedTuple):
    """Where a second tree stops fitting a first: the key path and what each has there."""

    path: tuple[Any, ...]
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
    tree: Any,
    other: Any,
    *,
    is_leaf: Callable[[Any], bool] | None = None,
    other_covers: Callable[[Any], bool] | None = None,
    path: tuple[Any, ...] = (),
) -> Mismatch | None:
    """The first place (in flatten order) where `other` does not fit `tree`, or `None`.

    `other` fits when it has `tree`'s structure: the same node types with the same key
    entries and the same static data, down to the leaves of `tree` (split with
    `is_leaf`). With `other_covers`, a node of `other` for which it returns True stands
    for the whole subtree of `tree` at its place (a prefix: a mask's `True`, a label);
    without it, `other` must have a leaf exactly where `tree` has one.
    """
    tree_kind = node_kind(tree, is_leaf)
    tree_opened = None if tree_kind == LEAF else open_node(tree, tree_kind)
    if other_covers is not None and other_covers(other):
        return None
    other_kind = node_kind(other)
    other_opened = None if other_kind == LEAF else open_node(other, other_kind)
    if tree_opened is None or other_opened is None:
        # leaf against leaf: `is_leaf` splits `other` too (a frozen value against a frozen one)
        if tree_opened is None and other_covers is None:
            if other_opened is None or (is_leaf is not None and is_leaf(other)):
                return None
        return Mismatch(path, describe(tree, tree_opened), describe(other, other_opened))
    if type(tree) is not type(other):
        return Mismatch(path, describe(tree, tree_opened), describe(other, other_opened))
    if tree_opened.entries != other_opened.entries:
        only_tree, only_other = _keys_difference(tree_opened, other_opened)
        return Mismatch(
            path,
            describe(tree, tree_opened),
            describe(other, other_opened),
            tuple(only_tree),
            tuple(only_other),
        )
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


def _keys_difference(tree_opened: Opened, other_opened: Opened) -> tuple[list[str], list[str]]:
    """`(only in tree, only in other)`: the key entries, as `keystr` text."""
    t = [jax.tree_util.keystr((e,)) for e in tree_opened.entries]
    o = [jax.tree_util.keystr((e,)) for e in other_opened.entries]
    return [k for k in t if k not in o], [k for k in o if k not in t]
