"""A tree as checkpoint entries, checked against a catalog and restored: format-neutral.

What is saved is decided by walking the tree with its frozen values as leaves, and into
every frozen subtree: every array (frozen or not) and numpy scalar is *data* and becomes a
tensor; Python numbers are data too; strings, `None` and tuples or lists of such plain
values (leaves, frozen values, static fields) are recorded, and a static field holding
another container is recorded part by part; functions and other objects are never saved
(only their type's name): they come from the template given to `load` / `from_state_dict`,
which also decides the structure and what is frozen.

Loading compares every entry of the template with a *catalog*: what a checkpoint holds
under each name, as the checks see it (`Stored`). A state dict is one catalog; a file is
another (`_document.SourceCatalog`, over any `CheckpointSource`).
"""

from __future__ import annotations

import bisect
import gc
import re
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import ml_dtypes  # a dependency of jax: the bfloat16, float8 and int4 numpy dtypes
import numpy as np
from jax.core import Tracer
from jax.tree_util import GetAttrKey

from .._periodic import Periodic
from .._stacked import Stacked
from .._structure import LEAF as LEAF_KIND_CODE
from .._structure import Wrapper, is_wrapper, node_kind, open_node, row_of
from .._structure import rebuild as rebuild_node
from .._values import (
    entry_name,
    exact_key,
    host_bytes,
    is_prng_key,
    path_str,
    root_name,
    short_repr,
)
from ._json import check_text
from ._processes import place_by_slices

__all__ = [
    "release_host_copy",
    "LEAF",
    "FROZEN",
    "STATIC",
    "TENSOR",
    "NUMBER",
    "PLAIN",
    "OBJECT",
    "NUMBERS",
    "Entry",
    "Stored",
    "Catalog",
    "LoadReport",
    "FrozenMapping",
    "StateCatalog",
    "entries",
    "category",
    "is_plain",
    "is_abstract",
    "dtype_name",
    "numpy_dtype",
    "describe",
    "is_weak",
    "PLAIN_DEPTH",
    "describe_array",
    "restore",
    "MISSING_POLICIES",
    "UNEXPECTED_POLICIES",
    "state_dict_of",
    "StackAt",
    "stacks_of",
]

LEAF, FROZEN, STATIC = "leaf", "frozen", "static"
# what a value is to a checkpoint
TENSOR, NUMBER, PLAIN, OBJECT = "tensor", "number", "plain", "object"
NUMBERS = (bool, int, float, complex)


# --------------------------------------------------------------------------------------
# Walking a tree: leaves, frozen values (into frozen subtrees) and static fields
# --------------------------------------------------------------------------------------


def _walk(
    node: Any,
    visit: Callable[[tuple, str, Any], Any],
    rebuild: bool,
    path: tuple = (),
    frozen: bool = False,
) -> Any:
    """Call `visit(path, kind, value)` on every leaf, wrapped leaf and static part.

    Each node is asked through its row of the table of node kinds: a wrapper kind (a
    frozen value) is walked into, its leaves `FROZEN`; a row's static parts (a TreeClass's
    static fields) are visited as `STATIC`; the children are the node's JAX flatten, so a
    stack's leaves are its stacked arrays. With `rebuild`, return the tree with each leaf
    replaced by what `visit` returned, each wrapped subtree rebuilt and wrapped again;
    static parts stay as they are.
    """
    row = row_of(node)
    wrapper = row.wrapper
    if wrapper is not None:
        value = wrapper.unwrap(node)
        inner = _walk(value, visit, rebuild, path, frozen=True)
        # an unchanged wrapped value keeps its node: wrapping again would hash it again
        if not rebuild or inner is value:
            return node if rebuild else None
        return _rewrapped(node, wrapper, inner)
    for name, value in row.static_values(node).items():
        visit((*path, GetAttrKey(name)), STATIC, value)
    kind = node_kind(node)
    opened = None if kind == LEAF_KIND_CODE else open_node(node, kind)
    if opened is None:
        return visit(path, FROZEN if frozen else LEAF, node)
    children = [
        _walk(child, visit, rebuild, (*path, entry), frozen)
        for entry, child in zip(opened.entries, opened.children)
    ]
    return rebuild_node(node, kind, opened.aux, children) if rebuild else None


def _rewrapped(node: object, wrapper: Wrapper, value: object) -> Any:
    """A node of `node`'s wrapper kind around `value`: made by the function the kind's row
    names as its maker (`freeze`), found in the module defining the kind (a row says how
    to unwrap a value, not how to wrap one)."""
    make = getattr(sys.modules.get(type(node).__module__), wrapper.maker, None)
    if not callable(make):
        raise TypeError(
            f"cannot restore {wrapper.what}: its maker {wrapper.maker!r} is not a function "
            f"of the module {type(node).__module__!r}, which defines `{type(node).__name__}`"
        )
    return make(value)


def category(value: Any) -> str:
    if isinstance(value, (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct)):
        return TENSOR
    if type(value) in NUMBERS:
        return NUMBER
    if is_plain(value):
        return PLAIN
    return OBJECT


# how deeply tuples and lists of plain values may nest to be recorded: a file's metadata
# is read with a bounded nesting depth, and what we write must be readable
PLAIN_DEPTH = 16


class TooDeep(ValueError):
    """A tuple or list of plain values nested deeper than `PLAIN_DEPTH`."""


def is_plain(value: Any, depth: int = 0) -> bool:
    kind = type(value)
    if kind in (str, bool, int, float, complex) or value is None:
        return True
    if kind not in (tuple, list):
        return False
    if depth >= PLAIN_DEPTH:
        raise TooDeep(f"it nests tuples or lists more than {PLAIN_DEPTH} levels deep")
    return all(is_plain(x, depth + 1) for x in value)


def _check_plain_text(value: Any) -> None:
    if type(value) is str:
        check_text(value, "the string")
    elif type(value) in (tuple, list):
        for item in value:
            _check_plain_text(item)


def is_abstract(value: Any) -> bool:
    return isinstance(value, (jax.ShapeDtypeStruct, Tracer))


def _key_name(key: Any) -> str:
    return str(entry_name(key))


def _state_key(key: Any) -> Any:
    name = entry_name(key)
    return name if name is not key else str(key)


class Entry(NamedTuple):
    path: tuple
    kind: str  # leaf, frozen or static
    value: Any
    name: str  # the checkpoint name: key path joined with dots
    category: str  # tensor, number, plain or object
    # the key path of the node the entry belongs to: its own for a leaf or frozen value; for
    # a static value (or a part of one) that of the TreeClass holding the field
    node: tuple


_NO_KEYS = (
    "{action} needs a tree with keys, but got a single {type}: the checkpoint names its "
    "values by their key paths. Put it in a container:\n"
    "    before: {call}\n"
    "    after:  {fixed}"
)
_SAME_NAME = (
    "Two key paths of the tree have the same checkpoint name {name!r}: {first} and "
    "{second}. Names join the keys with dots, so a dict key containing a dot, or the keys "
    "0 and '0' side by side, collide. Rename one of the keys."
)


_UNNAMEABLE = (
    "{where} cannot be recorded in a checkpoint: {reason}. Checkpoint names and values must "
    "be readable by every safetensors reader; change the key or the value."
)


def _static_parts(value: Any) -> list[tuple[Any, Any]]:
    """The children of a static value that is a container, with their key entries.

    A static field is one opaque node of the tree, but its value is checked against the
    checkpoint like any value: a container (a tuple holding an array or a function, a
    namedtuple) cannot be recorded as one plain value, so each of its parts is an entry of
    its own, under the field's name (`act.0`), and the container's type is one too.
    """
    try:
        opened = open_node(value, node_kind(value))
    except Exception:  # a broken flatten: an object like any other
        return []
    return [] if opened is None else list(zip(opened.entries, opened.children))


def entries(tree: Any, action: str, call: str, to_file: bool = False) -> list[Entry]:
    """Every leaf, frozen leaf and static field of `tree` (and each part of a static
    container, see `_static_parts`), named; `call` shows `action`'s call with the tree as
    `value`, for the message that a single leaf gets. With `to_file`, refuse names and
    strings a file cannot hold (lone surrogates)."""
    found: list[Entry] = []

    def add(path: tuple, kind: str, value: Any, node: tuple, depth: int = 0) -> None:
        name = ".".join(_key_name(key) for key in path)
        try:
            entry = Entry(path, kind, value, name, category(value), node)
            if to_file:
                check_text(name, "the checkpoint name")
                if entry.category == PLAIN:
                    _check_plain_text(value)
            parts = _static_parts(value) if kind == STATIC and entry.category == OBJECT else ()
            if parts and depth >= PLAIN_DEPTH:
                raise TooDeep(f"it nests containers more than {PLAIN_DEPTH} levels deep")
        except ValueError as error:
            raise ValueError(_UNNAMEABLE.format(where=path_str(tree, path), reason=error)) from None
        found.append(entry)
        for key, part in parts:
            add((*path, key), STATIC, part, node, depth + 1)

    def visit(path: tuple, kind: str, value: Any) -> None:
        if not path:
            fixed = call.replace("value", "{'value': value}")
            raise ValueError(
                _NO_KEYS.format(action=action, type=type(value).__name__, call=call, fixed=fixed)
            )
        add(path, kind, value, path[:-1] if kind == STATIC else path)

    _walk(tree, visit, rebuild=False)
    seen: dict[str, Entry] = {}
    for entry in found:
        other = seen.setdefault(entry.name, entry)
        if other is not entry:
            raise ValueError(
                _SAME_NAME.format(
                    name=entry.name,
                    first=path_str(tree, other.path),
                    second=path_str(tree, entry.path),
                )
            )
    return found


# --------------------------------------------------------------------------------------
# Stacks: a stacked leaf's name and the names of its layers
# --------------------------------------------------------------------------------------


def _joined(prefix: str, rest: str) -> str:
    return f"{prefix}.{rest}" if prefix else rest


class StackAt(NamedTuple):
    """A `Stacked` or `Periodic` of a tree, as its checkpoint names see it.

    A stack's leaves are named by its block's key paths (`blocks.attn.q`, of shape
    `[N, ...]`; `layers.pattern.5.attn.q` of shape `[R, ...]` for position 5 of a periodic
    pattern of P); the unrolled model names layer `i` `blocks.{i}.attn.q`. Layer `i` is
    slot `i` of the stacked leaf, or slot `i // P` of pattern position `i % P`.
    """

    prefix: str  # the stack's own name ("" for a stack at the root)
    layers: int  # N, or R * P
    period: int  # 1 for a `Stacked`, P for a `Periodic`
    periodic: bool = False  # its leaves are under `pattern.<position>`

    def stacked(self, name: str) -> tuple[str, int] | None:
        """The stacked leaf's name and slot that the per-layer `name` is one layer of, or
        None if `name` is not `<prefix>.<layer>.<rest>` with a layer of this stack."""
        start = len(self.prefix) + 1 if self.prefix else 0
        if self.prefix and not name.startswith(self.prefix + "."):
            return None
        head, dot, rest = name[start:].partition(".")
        if not (dot and rest and head.isdigit() and str(int(head)) == head):
            return None
        layer = int(head)
        if layer >= self.layers:
            return None
        if not self.periodic:
            return _joined(self.prefix, rest), layer
        slot, position = divmod(layer, self.period)
        return _joined(self.prefix, f"pattern.{position}.{rest}"), slot

    def layer_beyond(self, name: str) -> int | None:
        """The layer number of a per-layer name of this stack's layout whose layer the
        stack does not have (`blocks.5.w` for a stack of 4), else None."""
        start = len(self.prefix) + 1 if self.prefix else 0
        if self.prefix and not name.startswith(self.prefix + "."):
            return None
        head, dot, rest = name[start:].partition(".")
        if dot and rest and head.isdigit() and str(int(head)) == head:
            return int(head) if int(head) >= self.layers else None
        return None

    def per_layer(self, name: str) -> list[str] | None:
        """The per-layer names of the stacked leaf `name` (one per slot), or None if
        `name` is not one of this stack's leaves."""
        if self.prefix and not name.startswith(self.prefix + "."):
            return None
        rest = name[len(self.prefix) + 1 :] if self.prefix else name
        if not self.periodic:
            return [_joined(self.prefix, f"{i}.{rest}") for i in range(self.layers)]
        key, _, rest = rest.partition(".")
        position, _, rest = rest.partition(".")
        if key != "pattern" or not position.isdigit() or not rest:
            return None
        j, repeats = int(position), self.layers // self.period
        return [_joined(self.prefix, f"{r * self.period + j}.{rest}") for r in range(repeats)]

    def pattern(self, name: str) -> str | None:
        """`name`'s key path within one layer, with the layer as `{i}` (`blocks[{i}].w`),
        for a stacked leaf `name` of a `Stacked`; None otherwise."""
        if self.periodic or (self.prefix and not name.startswith(self.prefix + ".")):
            return None
        rest = name[len(self.prefix) + 1 :] if self.prefix else name
        return f"{self.prefix}[{{i}}].{rest}"


def stacks_of(tree: Any) -> list[StackAt]:
    """The outermost stacks of `tree` (a stack inside a stack's block is not one of them),
    the longest names first (so a name is matched with the innermost prefix it has)."""
    is_stack = lambda x: isinstance(x, (Stacked, Periodic))  # noqa: E731
    found = []
    leaves = jax.tree_util.tree_flatten_with_path(
        tree, is_leaf=lambda x: is_stack(x) or is_wrapper(x)
    )[0]
    for path, node in leaves:
        if is_stack(node):
            prefix = ".".join(_key_name(key) for key in path)
            periodic = isinstance(node, Periodic)
            found.append(StackAt(prefix, len(node), node.period if periodic else 1, periodic))
    return sorted(found, key=lambda s: -len(s.prefix))


# --------------------------------------------------------------------------------------
# dtypes, shapes and how values are described in messages
# --------------------------------------------------------------------------------------


def numpy_dtype(name: str) -> np.dtype | None:
    """The NumPy dtype of a name (`"bfloat16"` included), or None."""
    try:
        return np.dtype(name)
    except TypeError:
        kind = getattr(ml_dtypes, name, None)
        return np.dtype(kind) if kind is not None else None


def dtype_name(array: Any) -> str:
    """The name of an array's dtype (`"float32"`, `"bfloat16"`, `"key<fry>"`)."""
    return str(array.dtype) if is_prng_key(array) else np.dtype(array.dtype).name


def is_weak(value: Any) -> bool:
    """Whether an array (or abstract array) is weakly typed, as `jnp.asarray(0.5)` is."""
    return bool(getattr(value, "weak_type", False))


def describe_array(dtype_name: str, shape: tuple) -> str:
    return f"{dtype_name}[{','.join(map(str, shape))}]"


def describe(value: Any) -> str:
    if category(value) == TENSOR:
        return "an array " + describe_array(dtype_name(value), tuple(value.shape))
    if is_plain(value):
        return f"{type(value).__name__} {short_repr(value)}"
    return f"a {type(value).__name__} (not data)"


# --------------------------------------------------------------------------------------
# Catalogs: what a checkpoint holds, by name
# --------------------------------------------------------------------------------------


class Stored(NamedTuple):
    """What a catalog holds under one name, as the checks see it."""

    category: str  # tensor or plain (a number or another plain value) or object
    dtype: str = ""  # tensors: the dtype's name ("float32", "key<fry>")
    shape: tuple = ()
    value: Any = None  # plain values: the value; objects: the type's name
    weak: bool | None = None  # tensors: weakly typed (None: the catalog does not say)

    def describe(self) -> str:
        if self.category == TENSOR:
            return "an array " + describe_array(self.dtype, self.shape)
        if self.category == OBJECT:
            return f"a {self.value} (not saved)"
        return describe(self.value)


class Catalog(Protocol):
    """What `restore` reads: names, what is stored under each, and the values."""

    label: str  # "the file", in messages
    title: str  # "The checkpoint model.safetensors", at the head of an error
    call: str  # the call that loads it, with the template as `like`
    records_values: bool  # whether strings and static values are recorded
    problems: list[str]  # problems found before any entry is checked (report lines)

    def names(self) -> Iterable[str]: ...

    def stored(self, name: str) -> Stored | None: ...

    def fetch(self, name: str) -> Any: ...


class StateCatalog:
    """A nested state dict (as `state_dict` makes it, or orbax restores it) by name."""

    label = "the state dict"
    title = "The state dict"
    records_values = False  # a state dict has no strings or static values to check
    call = "tc.from_state_dict(like, state)"

    def __init__(self, state: dict) -> None:
        self.problems: list[str] = []
        self.values: dict[str, Any] = {}
        self._flatten(state, ())

    def _flatten(self, node: Any, prefix: tuple[str, ...]) -> None:
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            where = (*prefix, str(key))
            if isinstance(value, (dict, list, tuple)):
                self._flatten(value, where)
                continue
            name = ".".join(where)
            if name in self.values:
                raise ValueError(
                    f"the state dict has two values named {name!r} (an int key and a "
                    "string key alike?); rename one"
                )
            self.values[name] = value

    def names(self) -> Iterator[str]:
        return iter(self.values)

    def stored(self, name: str) -> Stored | None:
        if name not in self.values:
            return None
        value = self.values[name]
        if category(value) == TENSOR:
            return Stored(TENSOR, dtype_name(value), tuple(value.shape))
        return Stored(PLAIN, value=value)

    def fetch(self, name: str) -> Any:
        return self.values[name]


def state_dict_of(tree: Any) -> dict:
    """The data of `tree` as a nested dict (see `tc.state_dict`)."""
    out: dict = {}
    for entry in entries(tree, "tc.state_dict", "tc.state_dict(value)"):
        if entry.kind == STATIC or entry.category not in (TENSOR, NUMBER):
            continue
        value = entry.value
        if isinstance(value, Tracer):  # a frozen array of an abstract model
            value = jax.ShapeDtypeStruct(value.shape, value.dtype)
        node = out
        for key in entry.path[:-1]:
            node = node.setdefault(_state_key(key), {})
        node[_state_key(entry.path[-1])] = value
    return out


# --------------------------------------------------------------------------------------
# Checking a template against a catalog, and restoring it
# --------------------------------------------------------------------------------------


class FrozenMapping(Mapping[str, tuple[str, ...]]):
    """A read-only mapping that is a value: hashable, and equal to any mapping with the
    same items (a `LoadReport`'s `sources`; reports of two loads compare as values)."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, tuple[str, ...]] | None = None) -> None:
        self._items = dict(items or {})

    def __getitem__(self, key: str) -> tuple[str, ...]:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(frozenset(self._items.items()))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and self._items == dict(other.items())

    def __repr__(self) -> str:
        return repr(self._items)


class LoadReport(NamedTuple):
    """What `load` / `from_state_dict` with `strict=False` could not restore.

    - `missing`: key paths of the template (`MLP.layers[0].weight`) with no value in the
      checkpoint: they keep the template's value.
    - `mismatched`: key paths whose checkpoint value has another shape, dtype or type, or
      whose static value differs: they keep the template's value.
    - `unexpected`: names in the checkpoint (`layers.2.weight`) with no place in the
      template: ignored.
    - `messages`: one line per problem, as `strict=True` would report it.
    - `restored`: key paths whose value came from the checkpoint.
    - `sources`: for each restored path, the checkpoint names it was read from (one,
      or several when a key rule concatenated them).
    - `migrations`: the migration steps of versioned classes that ran, in order
      (`"Encoder 1 -> 2 (rules) at encoder"`); see the class keyword `version=`.

    `kept` is `missing + mismatched`: every path left at the template's value. Key paths
    outside a partial load's selection appear nowhere.

    ```python
    import os, tempfile
    import jax.numpy as jnp
    import treeclass as tc

    path = os.path.join(tempfile.mkdtemp(), "model.safetensors")
    tc.save(path, {"w": jnp.ones(2)})
    restored, report = tc.load(path, {"w": jnp.zeros(2), "b": jnp.zeros(1)}, strict=False)
    assert isinstance(report, tc.LoadReport)
    assert report.restored == ("tree['w']",) and report.missing == ("tree['b']",)
    assert report.kept == ("tree['b']",) and restored["w"].tolist() == [1.0, 1.0]
    ```
    """

    missing: tuple[str, ...]
    mismatched: tuple[str, ...]
    unexpected: tuple[str, ...]
    messages: tuple[str, ...]
    restored: tuple[str, ...] = ()
    sources: Mapping[str, tuple[str, ...]] = FrozenMapping()
    migrations: tuple[str, ...] = ()

    @property
    def kept(self) -> tuple[str, ...]:
        return self.missing + self.mismatched


_DOES_NOT_FIT = "{source} does not fit the template `{root}`; {count} problem{s}:\n{lines}\n{fixes}"

# what to do with a template entry: take the value from the catalog, keep the template's, or
# skip it (outside a partial load's selection: kept, and not reported)
_TAKE, _KEEP, _SKIP = "take", "keep", "skip"


class _Checker:
    """Compares every template entry with the catalog, collecting all problems at once."""

    def __init__(self, like: Any, source: Catalog, dry_run: bool = False) -> None:
        self.like = like
        self.source = source
        self.dry_run = dry_run  # no tensor bytes are read: static arrays are not compared
        self.used: set[str] = set()
        self.missing: list[str] = []
        self.mismatched: list[str] = []
        self.messages: list[Any] = []  # lines, or (path, name) of a missing entry
        # (kind, path, entry, stored) of each problem, for the fixes an error suggests
        self.problem_entries: list[tuple[str, str, Entry, Stored | None]] = []
        self.unused: list[str] = []

    def decide(self, entry: Entry) -> str:
        stored = self.source.stored(entry.name)
        if stored is not None:
            self.used.add(entry.name)
        where = path_str(self.like, entry.path)
        if stored is None:
            # strings, objects and static values are not in state dicts or other tools'
            # files; arrays and numbers are in every checkpoint
            recorded = entry.category in (TENSOR, NUMBER) and entry.kind != STATIC
            if not (recorded or self.source.records_values):
                return _KEEP
            return self._missing(where, entry)
        if entry.category == OBJECT:
            # functions and other objects are never saved: they come from the template,
            # whatever non-data value the file had there (a function where the template
            # holds a jitted one, a partial, a builtin, a class). Data there (an array, a
            # string) means the model changed, and so does another type of a static
            # container, whose parts are checked one by one
            if stored.category == OBJECT and (
                stored.value == type(entry.value).__name__ or not _static_parts(entry.value)
            ):
                return _KEEP
            return self._mismatch(where, entry, stored, _mismatch_kind(entry, "type"))
        if entry.kind == STATIC:
            return self._static(where, entry, stored)
        if entry.category == TENSOR:
            if stored.category != TENSOR:
                if _abstract_number_fits(entry.value, stored):
                    return _TAKE
                return self._mismatch(where, entry, stored, "type")
            return self._tensor_fits(where, entry, stored) or _TAKE
        if entry.category == NUMBER:
            if not _number_fits(entry.value, stored):
                return self._mismatch(where, entry, stored, "type")
            return _TAKE
        if stored.category == PLAIN and type(stored.value) is type(entry.value):
            return _TAKE
        return self._mismatch(where, entry, stored, "type")

    def _tensor_fits(self, where: str, entry: Entry, stored: Stored) -> str | None:
        """None if the stored tensor has the template's shape and dtype, else a mismatch."""
        dtype, shape = dtype_name(entry.value), tuple(entry.value.shape)
        if stored.shape != shape:
            return self._mismatch(where, entry, stored, _mismatch_kind(entry, "shape"))
        if stored.dtype != dtype:
            return self._mismatch(where, entry, stored, _mismatch_kind(entry, "dtype"))
        return None

    def _static(self, where: str, entry: Entry, stored: Stored) -> str:
        """A static field is never restored: it is checked to equal what was saved."""
        if entry.category == TENSOR:
            if stored.category != TENSOR:
                return self._mismatch(where, entry, stored, "static")
            mismatch = self._tensor_fits(where, entry, stored)
            if mismatch is not None:
                return mismatch
            if stored.weak is not None and stored.weak != is_weak(entry.value):
                return self._mismatch(where, entry, stored, "static")
            if is_abstract(entry.value) or self.dry_run:
                return _KEEP  # nothing to compare the saved values with, or not now
            saved = self.source.fetch(entry.name)
            if np.array_equal(host_bytes(saved), host_bytes(entry.value)):
                return _KEEP
            return self._mismatch(where, entry, stored, "static", saved)
        # exactly when the two would be the same constant of a traced computation
        if stored.category == PLAIN and exact_key(entry.value) == exact_key(stored.value):
            return _KEEP
        return self._mismatch(where, entry, stored, "static")

    def skip(self, entry: Entry) -> str:
        """An entry outside a partial load: kept, and its name in the checkpoint is not
        unexpected (it belongs to the template)."""
        if self.source.stored(entry.name) is not None:
            self.used.add(entry.name)
        return _SKIP

    def _missing(self, where: str, entry: Entry) -> str:
        self.missing.append(where)
        if entry.name in getattr(self.source, "explained", ()):
            return _KEEP  # the catalog's own problem line says why (a stack lacks layers)
        self.problem_entries.append(("missing", where, entry, None))
        # the hint is added by `finish`, which knows which names no entry used
        self.messages.append((where, entry.name))
        return _KEEP

    def _mismatch(
        self, where: str, entry: Entry, stored: Stored, what: str, saved: Any = None
    ) -> str:
        self.mismatched.append(where)
        self.problem_entries.append((what, where, entry, stored))
        mine, theirs = describe(entry.value), stored.describe()
        if saved is not None:  # a static array: show the values that differ
            mine = f"{mine} {_shown_values(entry.value)}"
            theirs = f"{theirs} {_shown_values(saved)}"
        elif is_weak(entry.value) != bool(stored.weak) and stored.weak is not None:
            mine, theirs = _weakly(mine, is_weak(entry.value)), _weakly(theirs, stored.weak)
        self.messages.append(
            f"{what:<11} {where}: {mine} in the template, {theirs} in {self.source.label}"
        )
        return _KEEP

    def _hint(self, name: str, closest: _Closest) -> str:
        # a key rule that should have given `name`: the file's name it reads, and the
        # closest the file has to that (a typo in the rule, or another naming)
        expected = getattr(self.source, "expected", None)
        wanted = expected(name) if expected is not None else ()
        if wanted:
            close = [c for c in map(closest, wanted) if c is not None]
            hint = f" (a key rule reads it from {', '.join(map(repr, wanted))}"
            return hint + (f"; closest: {', '.join(map(repr, close))})" if close else ")")
        close_name = closest(name)
        return f" (closest: {close_name!r})" if close_name is not None else ""

    def finish(
        self, found: list[Entry], decisions: list[str], problems: Sequence[str]
    ) -> LoadReport:
        """The report, once every entry is decided: unexpected names and missing hints."""
        unused = [name for name in self.source.names() if name not in self.used]
        self.unused = unused
        label = self.source.label
        closest = _Closest(unused)
        self.closest = closest
        messages = []
        for message in self.messages:
            if isinstance(message, tuple):  # a missing entry: hint at a renamed one
                where, name = message
                message = f"missing     {where}: no {name!r} in {label}{self._hint(name, closest)}"
            messages.append(message)
        for name in unused:
            stored = self.source.stored(name)
            assert stored is not None  # a name the catalog listed
            origins = _origins(self.source, name)
            read = f" (read from {', '.join(map(repr, origins))})" if origins != (name,) else ""
            messages.append(
                f"unexpected  {name!r} ({stored.describe()}) in {label}{read}: "
                "the template has no such path"
            )
        messages.extend(problems)
        restored = [
            (e, path_str(self.like, e.path)) for e, d in zip(found, decisions) if d == _TAKE
        ]
        sources = {where: _origins(self.source, e.name) for e, where in restored}
        return LoadReport(
            tuple(self.missing),
            tuple(self.mismatched),
            tuple(unused),
            tuple(messages),
            tuple(where for _, where in restored),
            FrozenMapping(sources),
            _migrations(self.source),
        )


def _origins(catalog: Any, name: str) -> tuple[str, ...]:
    """The names in the checkpoint itself that `name` of `catalog` is made of.

    A catalog wrapping another (key rules, a migration step) has `inner` and says which of
    its names each of its own is made of (`sources`); the chain is followed to the file.
    """
    names: tuple[str, ...] = (name,)
    while hasattr(catalog, "inner") and hasattr(catalog, "sources"):
        names = tuple(dict.fromkeys(n for own in names for n in catalog.sources(own)))
        catalog = catalog.inner
    return names


def _migrations(catalog: Any) -> tuple[str, ...]:
    """The migration steps in a chain of catalogs (each one's `migration`), in order."""
    ran = []
    while catalog is not None:
        if getattr(catalog, "migration", None) is not None:
            ran.append(catalog.migration)
        catalog = getattr(catalog, "inner", None)
    return tuple(reversed(ran))


def _mismatch_kind(entry: Entry, what: str) -> str:
    return "static" if entry.kind == STATIC else what


def _shown_values(array: Any) -> str:
    """An array's values on one line, shortened, for a message (a PRNG key's by its key
    data)."""
    if is_prng_key(array):
        array = jax.random.key_data(array)
    text = " ".join(np.array2string(np.asarray(array), threshold=8, separator=",").split())
    return text if len(text) <= 60 else text[:57] + "..."


def _weakly(description: str, weak: bool) -> str:
    return description + (" (weakly typed)" if weak else " (strongly typed)")


def _common_prefix(a: str, b: str) -> int:
    """The length of the longest common prefix, by bisection over slice comparisons."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


class _Closest:
    """The closest of many names to a missing one, in time near-linear in their number.

    Comparing every missing name with every unused one (as `difflib.get_close_matches`
    would) costs their product: minutes for thousands of renamed keys. A rename keeps a
    long common prefix or suffix (`layers.3.w` -> `layers.3.weight`, `encoder.x` ->
    `model.encoder.x`), and the names sharing the longest prefix with a name sit next to
    it in sorted order, those sharing the longest suffix next to it in the order of the
    reversed names. So each missing name is scored against its few neighbours in both
    orders only (two in each): by the share of characters in a common prefix and suffix, difflib's
    measure of similarity restricted to those two blocks, with difflib's cutoff of 0.6.
    """

    _CUTOFF = 0.6

    def __init__(self, names: list[str]) -> None:
        self.forward = sorted(names)
        self.backward = sorted(name[::-1] for name in names)

    @staticmethod
    def _near(ordered: list[str], key: str) -> list[str]:
        # the longest common prefix with `key` is had by one of its two neighbours
        at = bisect.bisect_left(ordered, key)
        return ordered[max(at - 1, 0) : at + 1]

    def __call__(self, name: str) -> str | None:
        candidates = set(self._near(self.forward, name))
        reversed_name = name[::-1]
        candidates.update(n[::-1] for n in self._near(self.backward, reversed_name))
        best, best_score = None, self._CUTOFF
        for candidate in sorted(candidates):
            shared = _common_prefix(name, candidate) + _common_prefix(
                reversed_name, candidate[::-1]
            )
            shared = min(shared, len(name), len(candidate))
            score = 2 * shared / (len(name) + len(candidate))
            if score > best_score or (score == best_score and best is None):
                best, best_score = candidate, score
        return best


_UNFILLED = (
    "{source} leaves {paths} of the abstract template without a value: a "
    "jax.ShapeDtypeStruct has no value to keep, so each path of an abstract template "
    "must come from the checkpoint. Give those paths values (a template built with "
    "concrete arrays keeps its own), or make the checkpoint fill them (rules=)."
)
_LESS = (
    "{source}: restored {restored} of the template's paths; {count} more that it holds "
    "under another name, dtype or layout were not restored and keep the template's "
    "values: {paths}. Fixes that fit:"
)


def _listed(paths: Sequence[str], limit: int = 5) -> str:
    shown = ", ".join(paths[:limit])
    return shown + (f" and {len(paths) - limit} more" if len(paths) > limit else "")


def _warn_if_less(
    like: Any, source: Catalog, checker: _Checker, report: LoadReport, missing: str, unexpected: str
) -> None:
    """Warn when a non-strict load kept template values where the checkpoint holds the
    data under another name, dtype or layout (what a fix would restore), with the count
    and the fixes; a path the checkpoint has nothing for, or another shape of, is only
    reported."""
    fixes = _Fixes(like, source, checker, False, missing, unexpected)
    lines = [
        line
        for line in fixes.lines()
        if not line.startswith("- to ") and "has another shape" not in line
    ]
    if fixes.fixable:
        message = _LESS.format(
            source=source.title,
            restored=len(report.restored),
            count=len(fixes.fixable),
            paths=_listed(fixes.fixable),
        )
        warnings.warn(message + "\n" + "\n".join(lines), stacklevel=4)


_DIGITS = re.compile(r"(?:^|(?<=\.))\d+(?=\.|$)")


def _pattern(name: str) -> tuple[str, tuple[str, ...]]:
    """A name with its number segments as captures (`h.3.w` -> `h.{i}.w`), and them."""
    found = _DIGITS.findall(name)
    letters = iter("ijklmn")
    return _DIGITS.sub(lambda m: "{" + next(letters, "p") + "}", name), tuple(found)


def _rule_between(source: str, target: str) -> tuple[str, str]:
    """A key rule mapping `source` (a file name) to `target` (a template name), with the
    number segments they share as captures (one rule for every layer)."""
    numbers = [n for n in _DIGITS.findall(source) if n in _DIGITS.findall(target)]
    if numbers and _DIGITS.findall(source) == _DIGITS.findall(target):
        return _pattern(source)[0], _pattern(target)[0]
    return source, target


class _Fixes:
    """The fixes a failed load suggests, computed from its problems: a key rule for a
    renamed path (a migration when the file is treeclass's own), `astype` for another
    dtype, a transpose for a transposed weight, a key rule onto a stack's blocks for
    per-layer tensors in a stacked template, a policy for names only one side has."""

    def __init__(
        self,
        like: Any,
        source: Catalog,
        checker: _Checker,
        strict: bool,
        missing: str,
        unexpected: str,
    ) -> None:
        self.like, self.source, self.checker = like, source, checker
        self.strict, self.missing, self.unexpected = strict, missing, unexpected
        self.call = source.call.replace("like", "model")

    def text(self) -> str:
        lines = self.lines()
        if not lines:
            lines = ["- fix the template (or the checkpoint) where they differ, as listed"]
        return "Fixes that fit these problems:\n" + "\n".join(lines)

    def lines(self) -> list[str]:
        checker = self.checker
        out: list[str] = []
        self.fixable: list[str] = []  # paths a suggested fix would restore
        renames: dict[tuple[str, ...], None] = {}
        partnered: set[str] = set()
        stacked = self._per_layer()
        by_pattern = self._by_pattern()
        for kind, where, entry, stored in checker.problem_entries:
            if kind == "missing":
                if entry.name in stacked:
                    self.fixable.append(where)
                    continue
                close = checker.closest(entry.name) or by_pattern.get(entry.name)
                if close is not None and close not in partnered:
                    if entry.kind != STATIC:  # (a static value is compared, not restored)
                        self.fixable.append(where)
                    partnered.add(close)
                    rule: tuple[str, ...] = _rule_between(close, entry.name)
                    theirs = self.source.stored(close)
                    shape = tuple(getattr(entry.value, "shape", ()))
                    if (
                        theirs is not None
                        and len(shape) == 2
                        and shape[0] != shape[1]
                        and tuple(theirs.shape) == shape[::-1]
                    ):  # a PyTorch-style [out, in] weight for an [in, out] one
                        rule = (*rule, "lambda w: w.T")
                    renames[rule] = None
            elif kind == "dtype" and stored is not None:
                self.fixable.append(where)
                out.append(
                    f"- {where} is {stored.dtype} in {self.source.label} and "
                    f"{dtype_name(entry.value)} in the template: convert it while loading "
                    f"with a key rule, rules=[({entry.name!r}, {entry.name!r}, lambda w: "
                    f"w.astype(jnp.{dtype_name(entry.value)}))], or build the template "
                    f"with {stored.dtype}"
                )
            elif kind == "shape" and stored is not None:
                shape = tuple(entry.value.shape)
                if len(shape) == 2 and tuple(stored.shape) == shape[::-1] and shape[0] != shape[1]:
                    self.fixable.append(where)
                    out.append(
                        f"- {where} is stored transposed ({list(stored.shape)} for "
                        f"{list(shape)}): rules=[({entry.name!r}, {entry.name!r}, "
                        "lambda w: w.T)]"
                    )
                else:
                    out.append(
                        f"- {where} has another shape in {self.source.label} "
                        f"({list(stored.shape)} for {list(shape)}): build the template "
                        "with the configuration the checkpoint was saved with"
                    )
        out.extend(self._renames(list(renames)))
        out.extend(stacked.values())
        out.extend(getattr(self.source, "fixes", ()))  # (a key rule catalog's own)
        lonely_missing = [
            e
            for k, _, e, _ in checker.problem_entries
            if k == "missing"
            and e.name not in stacked
            and checker.closest(e.name) is None
            and e.name not in by_pattern
        ]
        if lonely_missing and self.missing == "error":
            if any(isinstance(e.value, jax.ShapeDtypeStruct) for e in lonely_missing):
                out.append(
                    "- paths the checkpoint lacks need values: build the template with "
                    'concrete arrays and load with missing="keep" to keep them'
                )
            else:
                out.append(
                    "- to keep the template's values where the checkpoint has none: "
                    f'{self.call[:-1]}, missing="keep")'
                )
        lonely_unused = [n for n in checker.unused if n not in partnered]
        if lonely_unused and self.unexpected == "error" and not stacked:
            out.append(
                "- to leave out what the template has no place for: "
                f'{self.call[:-1]}, unexpected="ignore")'
            )
        return out

    def _by_pattern(self) -> dict[str, str]:
        """Missing names paired with unused ones of the same layout of numbers: the
        layers of `layers.{i}.w` for those of `blocks.{i}.w` (same numbers, same last
        segment) when no name is close enough by its letters."""

        def patterns(names: Iterable[str]) -> dict[tuple[str, str], dict[tuple, str]]:
            out: dict[tuple[str, str], dict[tuple, str]] = {}
            for name in names:
                pattern, numbers = _pattern(name)
                if numbers:
                    out.setdefault((pattern, name.rsplit(".", 1)[-1]), {})[numbers] = name
            return out

        missing = [e.name for k, _, e, _ in self.checker.problem_entries if k == "missing"]
        theirs = patterns(self.checker.unused)
        paired: dict[str, str] = {}
        for (_, last), mine in patterns(missing).items():
            for (_, other_last), names in theirs.items():
                if other_last == last and set(names) == set(mine):
                    paired.update({mine[n]: names[n] for n in mine})
                    break
        return paired

    def _renames(self, rules: list[tuple[str, ...]]) -> list[str]:
        if not rules:
            return []
        shown = ", ".join(
            "(" + ", ".join([repr(r[0]), repr(r[1]), *r[2:]]) + ")" for r in rules[:6]
        )
        more = ", ..." if len(rules) > 6 else ""
        line = f"- renamed paths: map the checkpoint's names with key rules, rules=[{shown}{more}]"
        if getattr(self.source, "class_versions", None) is not None and self.source.records_values:
            line += (
                "; if your class renamed them since the save, declare it once instead: "
                "bump the class's version= and give migrations={old version: {old name: "
                "new name}} (names relative to the class)"
            )
        return [line]

    def _per_layer(self) -> dict[str, str]:
        """Stacked template paths whose layers the checkpoint holds one by one (`h.0.w`,
        `h.1.w` for a `[L, ...]` leaf): the key rule mapping them onto the stack's blocks
        (the unstack recipe for a periodic stack), by template name."""
        groups: dict[str, dict[int, str]] = {}
        for name in self.checker.unused:
            for match in _DIGITS.finditer(name):
                pattern = name[: match.start()] + "{i}" + name[match.end() :]
                groups.setdefault(pattern, {})[int(match.group())] = name
        # by (last segment, number of layers): each template path meets only its own
        indexed: dict[tuple[str, int], list[tuple[str, dict[int, str]]]] = {}
        for pattern, members in groups.items():
            if sorted(members) == list(range(len(members))):
                key = (pattern.rsplit(".", 1)[-1], len(members))
                indexed.setdefault(key, []).append((pattern, members))
        found: dict[str, str] = {}
        stacks = stacks_of(self.like)
        for kind, where, entry, _ in self.checker.problem_entries:
            if kind != "missing" or entry.category != TENSOR or not entry.value.shape:
                continue
            layers, rest = entry.value.shape[0], tuple(entry.value.shape[1:])
            last = entry.name.rsplit(".", 1)[-1]
            for pattern, members in indexed.get((last, layers), [])[:8]:
                parts = [self.source.stored(n) for n in members.values()]
                if not all(p is not None and tuple(p.shape) == rest for p in parts):
                    continue
                target = next(
                    (t for t in map(lambda s: s.pattern(entry.name), stacks) if t is not None),
                    None,
                )
                head = (
                    f"- {where} is a stack of {layers} layers, and the checkpoint holds "
                    f"them one by one ({pattern!r} for i in 0..{layers - 1}): "
                )
                if target is not None:  # a key rule fills the stack's slots in this load
                    found[entry.name] = (
                        head + "map each onto its block of the stack with a key rule, "
                        f"rules=[({pattern!r}, {target!r})]"
                    )
                    break
                per_layer = self.call.replace("model", "tc.unstack_all(model)", 1)
                found[entry.name] = (
                    head + "load into the per-layer layout and stack again, model = "
                    f"tc.restack({per_layer}, model) (with rules= if the per-layer names "
                    "differ from the template's unstacked key paths)"
                )
                break
        return found


MISSING_POLICIES = ("error", "keep", "warn")
UNEXPECTED_POLICIES = ("error", "ignore")


def restore(
    like: Any,
    source: Catalog,
    strict: bool,
    action: str,
    *,
    selected: Callable[[tuple, str], bool] | None = None,
    missing: str | None = None,
    unexpected: str | None = None,
    dry_run: bool = False,
) -> Any:
    """`like` with its data from `source`: the tree, or `(tree, report)` if not `strict`.

    `selected(node, kind)` (of an `Entry`) limits the load to some entries (the rest keep
    the template's values and are not reported); `missing` ("error", "keep", "warn") and
    `unexpected` ("error", "ignore") say which of those problems raise (by default all of
    them when `strict`, none otherwise; an explicit "error" raises whatever `strict` is). A
    `dry_run` returns the report alone, read from names, dtypes and shapes: no tensor bytes.
    """
    missing = missing or ("error" if strict else "keep")
    unexpected = unexpected or ("error" if strict else "ignore")
    if missing not in MISSING_POLICIES or unexpected not in UNEXPECTED_POLICIES:
        raise ValueError(
            f"{action}: missing= takes one of {MISSING_POLICIES} and unexpected= one of "
            f"{UNEXPECTED_POLICIES}; got missing={missing!r}, unexpected={unexpected!r}"
        )
    found = entries(like, action, source.call.replace("like", "value"))
    checker = _Checker(like, source, dry_run)
    decisions = [
        checker.decide(entry)
        if selected is None or selected(entry.node, entry.kind)
        else checker.skip(entry)
        for entry in found
    ]
    report = checker.finish(found, decisions, source.problems)
    if dry_run:
        return report
    # strict raises for every problem its policies do not waive; a non-strict load only for
    # the kinds a policy asks to raise for explicitly (`missing="error"`)
    problems = [
        line
        for line in report.messages
        if (missing == "error" if line.startswith("missing ") else True)
        and (unexpected == "error" if line.startswith("unexpected ") else True)
        and (strict or line.startswith(("missing ", "unexpected ")))
    ]
    unfilled = [
        path_str(like, e.path)
        for e, d in zip(found, decisions)
        if d == _KEEP and e.kind != STATIC and isinstance(e.value, jax.ShapeDtypeStruct)
    ]
    if unfilled and not problems:  # (else the error below names them)
        raise ValueError(_UNFILLED.format(source=source.title, paths=_listed(unfilled)))
    if missing == "warn" and report.missing:
        lines = [line for line in report.messages if line.startswith("missing ")]
        warnings.warn(
            f"{source.title}: {len(lines)} template path(s) kept their initial values:\n"
            + "\n".join("  " + line for line in lines),
            stacklevel=3,
        )
    if problems:
        count = len(problems)
        raise ValueError(
            _DOES_NOT_FIT.format(
                source=source.title,
                root=root_name(like),
                count=count,
                s="" if count == 1 else "s",
                lines="\n".join("  " + line for line in problems),
                fixes=_Fixes(like, source, checker, strict, missing, unexpected).text(),
            )
        )
    if not strict:
        _warn_if_less(like, source, checker, report, missing, unexpected)
    # static values are checked above and never restored (nor visited part by part)
    steps = iter([(e, d) for e, d in zip(found, decisions) if e.kind != STATIC])

    def visit(path: tuple, kind: str, value: Any) -> Any:
        if kind == STATIC:
            return value
        entry, decision = next(steps)
        if decision != _TAKE:
            return value
        try:
            fetched = _fetch(source, entry, value)
        except ValueError as error:  # bytes the checks could not see before reading them
            raise ValueError(f"{error} (restoring {path_str(like, path)})") from None
        except OSError as error:  # reading failed: the same error, saying what it was for
            if error.errno is None:
                raise
            where = f"{error.strerror} (restoring {path_str(like, path)})"
            raise type(error)(error.errno, where, error.filename) from error
        if entry.category == TENSOR:
            if type(fetched) in NUMBERS:
                return fetched
            stored = source.stored(entry.name)
            weak = stored.weak if stored is not None and stored.weak is not None else None
            return _place(value, fetched, is_weak(value) if weak is None else weak)
        if entry.category == NUMBER:
            return _to_number(value, fetched)
        return fetched

    tree = _walk(like, visit, rebuild=True)
    return tree if strict else (tree, report)


def _sharding_of(template: Any) -> Any:
    """The sharding a restored array takes from its template, or None (the default device)."""
    if isinstance(template, jax.ShapeDtypeStruct):
        return template.sharding
    if isinstance(template, jax.Array) and not isinstance(template, Tracer):
        if template.committed or len(template.sharding.device_set) > 1:
            return template.sharding
    return None


def _fetch(source: Catalog, entry: Entry, template: Any) -> Any:
    """The data of `entry` from `source`, for the template's leaf `template`.

    A tensor of a file whose template is placed over several devices is read shard by
    shard, straight into its sharding: each process reads only the bytes of the shards
    its devices hold (on many hosts, about its share of the file), and no device's data
    is copied on the host more than once. The catalog offers those ranges
    (`range_reader`) only where they pass the same checks as the whole tensor; everything
    else is read whole: tensors renamed or transformed by key rules, those stored as raw
    bytes or key data, bool and sub-byte types (whose unused bits are checked on the
    whole tensor).
    """
    placed = getattr(source, "fetch_placed", None)  # (a stacked leaf assembled in place)
    if placed is not None and entry.category == TENSOR:
        value = placed(entry.name, template)
        if value is not None:
            return value
    sharding = _sharding_of(template) if entry.category == TENSOR else None
    ranges = getattr(source, "range_reader", None)
    if sharding is None or len(sharding.device_set) < 2 or ranges is None:
        return source.fetch(entry.name)
    read_range = ranges(entry.name)
    stored = source.stored(entry.name)
    dtype = None if stored is None else numpy_dtype(stored.dtype)
    if read_range is None or stored is None or dtype is None:
        return source.fetch(entry.name)
    return place_by_slices(tuple(stored.shape), dtype, sharding, read_range)


# the host bytes a load may leave to the garbage collector before collecting them
_RELEASE_BYTES = 2**20


class _Released:
    """The host bytes put on the device since the last collection (`release_host_copy`)."""

    pending = 0


def release_host_copy(placed: Any, nbytes: int) -> None:
    """Free the host buffers (`nbytes` more) of tensors put on the device, the last one as
    `placed`, so a load holds about one tensor on the host at a time.

    JAX's transfer from a NumPy array leaves a young reference cycle that keeps the array
    alive until the garbage collector's next pass (measured: with a load's few
    allocations per tensor, the previous tensor was alive at nearly every read, doubling
    the host peak, and small tensors piled up between passes). Once 1 MiB has been put
    since the last pass, the load waits for the last transfer and makes one pass over the
    youngest generation, which frees them: a cost of one pass (microseconds) per
    MiB loaded, whatever the tensors' sizes.
    """
    _Released.pending += nbytes
    if _Released.pending >= _RELEASE_BYTES:
        _Released.pending = 0
        jax.block_until_ready(placed)
        gc.collect(0)


def _place(template: Any, value: Any, weak: bool) -> Any:
    """`value` (checked to have the template's shape and dtype) as the template's type.

    A `jax.Array` is weakly typed if `weak` (`jnp.asarray(0.5)` is: it adopts the dtype of
    what it meets, and `jax.jit` keys its cache on that).
    """
    if isinstance(template, (np.ndarray, np.generic)):  # its dtype: its byte order, too
        value = np.asarray(value, dtype=template.dtype)
        return value[()] if isinstance(template, np.generic) else value
    sharding = _sharding_of(template)
    placed = isinstance(value, jax.Array) and value.sharding == sharding  # (by `_fetch`)
    host = value
    if sharding is not None and not placed:
        value = jax.device_put(value, sharding)
    elif not isinstance(value, jax.Array):
        value = jax.device_put(value)
    if value is not host and not isinstance(host, jax.Array):
        release_host_copy(value, getattr(host, "nbytes", 0))
    if is_prng_key(value) or is_weak(value) == weak:  # (keys are never weakly typed)
        return value
    return _with_weak_type(value, weak)


def _with_weak_type(value: jax.Array, weak: bool) -> Any:
    """`value` with the same data, dtype and placement, weakly typed or not."""
    if not weak:  # a weakly typed array of a state dict, in a strong template
        return jax.lax.convert_element_type(value, value.dtype)
    # JAX has no public way to make an array of given data weakly typed (only Python
    # scalars, and `jnp.full` without a dtype, make them), so this uses the conversion its
    # own operations use. The one use of a private JAX name in treeclass's checkpoints.
    from jax._src.lax.lax import _convert_element_type

    return _convert_element_type(value, np.dtype(value.dtype), weak_type=True)


def _is_kind_of(dtype: np.dtype, kind: type, widening: bool = False) -> bool:
    """Whether `dtype` is of the kind of a Python number of type `kind`: bool, an integer,
    a floating or a complex dtype; with `widening`, a complex `kind` takes floating dtypes
    too (their values convert to complex exactly)."""
    if kind is bool:
        return dtype == np.bool_
    if kind is int:
        return bool(np.issubdtype(dtype, np.integer))
    wanted = np.floating if kind is float else np.inexact if widening else np.complexfloating
    return bool(jnp.issubdtype(dtype, wanted))


def _number_fits(template: Any, stored: Stored) -> bool:
    """Whether the stored value converts exactly to the template's Python number type."""
    if stored.category == TENSOR:  # a scalar of a numeric dtype (a key's has no NumPy dtype)
        dtype = numpy_dtype(stored.dtype) if stored.shape == () else None
        return dtype is not None and _is_kind_of(dtype, type(template), widening=True)
    return stored.category == PLAIN and _to_number(template, stored.value) is not None


def _abstract_number_fits(template: Any, stored: Stored) -> bool:
    """A Python number saved where an abstract template has a scalar of its kind.

    `jax.eval_shape` turns a Python number into a weakly typed 0-d `ShapeDtypeStruct`,
    so an abstract template cannot say that the value was a number: the file can.
    """
    if not is_abstract(template) or template.shape != () or is_prng_key(template):
        return False
    kind = type(stored.value)
    return kind in NUMBERS and _is_kind_of(np.dtype(template.dtype), kind)


def _to_number(template: Any, value: Any) -> Any:
    """`value` (a number or a 0-d array) as the template's Python type, or None."""
    kind = type(template)
    if isinstance(value, (jax.Array, np.ndarray, np.generic)):
        value = np.asarray(value).item()
    if type(value) is bool or kind is bool:
        return value if type(value) is kind else None
    allowed = {int: (int,), float: (int, float), complex: (int, float, complex)}[kind]
    return kind(value) if type(value) in allowed else None
