"""A tree as checkpoint entries, checked against a catalog and restored: format-neutral.

What is saved is decided by walking the tree with its frozen values as leaves, and into
every frozen subtree: every array (frozen or not) and numpy scalar is *data* and becomes a
tensor; Python numbers are data too; strings, `None` and tuples or lists of such plain
values (leaves, frozen values, static fields) are recorded; functions and other objects
are never saved: they come from the template given to `load` / `from_state_dict`, which
also decides the structure and what is frozen.

Loading compares every entry of the template with a *catalog*: what a checkpoint holds
under each name, as the checks see it (`Stored`). A state dict is one catalog; a file is
another (`_document.SourceCatalog`, over any `CheckpointSource`).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import ml_dtypes  # a dependency of jax: the bfloat16, float8 and int4 numpy dtypes
import numpy as np
from jax.core import Tracer

from .. import _node
from .._frozen import freeze, is_frozen, unfreeze
from .._structure import entry_name, path_str, root_name

__all__ = [
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
    "StateCatalog",
    "entries",
    "category",
    "is_plain",
    "is_abstract",
    "is_key_dtype",
    "dtype_name",
    "numpy_dtype",
    "describe",
    "describe_array",
    "restore",
    "state_dict_of",
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
    """Call `visit(path, kind, value)` on every leaf, frozen leaf and static field.

    With `rebuild`, return the tree with each leaf replaced by what `visit` returned, and
    each frozen subtree rebuilt and frozen again; static fields stay as they are.
    """
    if _node.is_treeclass(node):
        for name, value in _node.static_values(node).items():
            visit((*path, jax.tree_util.GetAttrKey(name)), STATIC, value)

    def stop(x: Any) -> bool:
        return x is not node and (is_frozen(x) or _node.is_treeclass(x))

    items, treedef = jax.tree_util.tree_flatten_with_path(node, is_leaf=stop)
    new = []
    for sub, x in items:
        where = path + sub
        if is_frozen(x):
            inner = _walk(unfreeze(x), visit, rebuild, where, frozen=True)
            if rebuild:
                # an unchanged frozen value keeps its node: freezing again would hash it again
                new.append(x if inner is unfreeze(x) else freeze(inner))
        elif _node.is_treeclass(x) and x is not node:
            new.append(_walk(x, visit, rebuild, where, frozen))
        else:
            new.append(visit(where, FROZEN if frozen else LEAF, x))
    if not rebuild:
        return None
    return treedef.unflatten(new)


def category(value: Any) -> str:
    if isinstance(value, (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct)):
        return TENSOR
    if type(value) in NUMBERS:
        return NUMBER
    if is_plain(value):
        return PLAIN
    return OBJECT


def is_plain(value: Any) -> bool:
    kind = type(value)
    if kind in (str, bool, int, float, complex) or value is None:
        return True
    return kind in (tuple, list) and all(is_plain(x) for x in value)


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


def entries(tree: Any, action: str, call: str) -> list[Entry]:
    """Every leaf, frozen leaf and static field of `tree`, named; `call` shows `action`'s
    call with the tree as `value`, for the message that a single leaf gets."""
    found: list[Entry] = []

    def visit(path: tuple, kind: str, value: Any) -> None:
        if not path:
            fixed = call.replace("value", "{'value': value}")
            raise ValueError(
                _NO_KEYS.format(action=action, type=type(value).__name__, call=call, fixed=fixed)
            )
        name = ".".join(_key_name(key) for key in path)
        found.append(Entry(path, kind, value, name, category(value)))

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
# dtypes, shapes and how values are described in messages
# --------------------------------------------------------------------------------------


def numpy_dtype(name: str) -> np.dtype | None:
    """The NumPy dtype of a name (`"bfloat16"` included), or None."""
    try:
        return np.dtype(name)
    except TypeError:
        kind = getattr(ml_dtypes, name, None)
        return np.dtype(kind) if kind is not None else None


def is_key_dtype(dtype: Any) -> bool:
    return jnp.issubdtype(dtype, jax.dtypes.prng_key)


def dtype_name(dtype: Any) -> str:
    return str(dtype) if is_key_dtype(dtype) else np.dtype(dtype).name


def describe_array(dtype_name: str, shape: tuple) -> str:
    return f"{dtype_name}[{','.join(map(str, shape))}]"


def describe(value: Any) -> str:
    if category(value) == TENSOR:
        return "an array " + describe_array(dtype_name(value.dtype), tuple(value.shape))
    if is_plain(value):
        text = repr(value)
        text = text if len(text) <= 40 else text[:37] + "..."
        return f"{type(value).__name__} {text}"
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
            return Stored(TENSOR, dtype_name(value.dtype), tuple(value.shape))
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


class LoadReport(NamedTuple):
    """What `load` / `from_state_dict` with `strict=False` could not restore.

    - `missing`: key paths of the template (`MLP.layers[0].weight`) with no value in the
      checkpoint: they keep the template's value.
    - `mismatched`: key paths whose checkpoint value has another shape, dtype or type, or
      whose static value differs: they keep the template's value.
    - `unexpected`: names in the checkpoint (`layers.2.weight`) with no place in the
      template: ignored.
    - `messages`: one line per problem, as `strict=True` would report it.

    `kept` is `missing + mismatched`: every path left at the template's value.
    """

    missing: tuple[str, ...]
    mismatched: tuple[str, ...]
    unexpected: tuple[str, ...]
    messages: tuple[str, ...]

    @property
    def kept(self) -> tuple[str, ...]:
        return self.missing + self.mismatched


_DOES_NOT_FIT = (
    "{source} does not fit the template `{root}`; {count} problem{s}:\n"
    "{lines}\n"
    "Fix the template (or the checkpoint), or restore what fits and keep the template's "
    "values elsewhere:\n"
    "    before: model = {call}\n"
    "    after:  model, report = {fixed}"
)

# what to do with a template entry: take the value from the catalog, or keep the template's
_TAKE, _KEEP = "take", "keep"


class _Checker:
    """Compares every template entry with the catalog, collecting all problems at once."""

    def __init__(self, like: Any, source: Catalog) -> None:
        self.like = like
        self.source = source
        self.used: set[str] = set()
        self.missing: list[str] = []
        self.mismatched: list[str] = []
        self.messages: list[Any] = []  # lines, or (path, name) of a missing entry

    def decide(self, entry: Entry) -> str:
        stored = self.source.stored(entry.name)
        if stored is not None:
            self.used.add(entry.name)
        where = path_str(self.like, entry.path)
        if entry.category == OBJECT:
            # functions and other objects come from the template; an array in their place
            # means the structure changed
            if stored is not None and stored.category == TENSOR:
                return self._mismatch(where, entry.value, stored, "type")
            return _KEEP
        if entry.kind == STATIC:
            if not is_plain(entry.value):
                return _KEEP  # not recorded (a function, a class): nothing to check
            if stored is None:
                return self._missing(where, entry) if self.source.records_values else _KEEP
            if stored.category == PLAIN and _same_value(entry.value, stored.value):
                return _KEEP
            return self._mismatch(where, entry.value, stored, "static")
        if stored is None:
            if entry.category == PLAIN and not self.source.records_values:
                return _KEEP  # strings are not in state dicts or other tools' files
            return self._missing(where, entry)
        if entry.category == TENSOR:
            if stored.category != TENSOR:
                if _abstract_number_fits(entry.value, stored):
                    return _TAKE
                return self._mismatch(where, entry.value, stored, "type")
            dtype, shape = dtype_name(entry.value.dtype), tuple(entry.value.shape)
            if stored.shape != shape:
                return self._mismatch(where, entry.value, stored, "shape")
            if stored.dtype != dtype:
                return self._mismatch(where, entry.value, stored, "dtype")
            return _TAKE
        if entry.category == NUMBER:
            if not _number_fits(entry.value, stored):
                return self._mismatch(where, entry.value, stored, "type")
            return _TAKE
        if stored.category == PLAIN and type(stored.value) is type(entry.value):
            return _TAKE
        return self._mismatch(where, entry.value, stored, "type")

    def _missing(self, where: str, entry: Entry) -> str:
        self.missing.append(where)
        # the hint is added by `finish`, which knows which names no entry used
        self.messages.append((where, entry.name))
        return _KEEP

    def _mismatch(self, where: str, value: Any, stored: Stored, what: str) -> str:
        self.mismatched.append(where)
        self.messages.append(
            f"{what:<11} {where}: {describe(value)} in the template, {stored.describe()} "
            f"in {self.source.label}"
        )
        return _KEEP

    def finish(self) -> LoadReport:
        """The report, once every entry is decided: unexpected names and missing hints."""
        unused = [name for name in self.source.names() if name not in self.used]
        label = self.source.label
        messages = []
        for message in self.messages:
            if isinstance(message, tuple):  # a missing entry: hint at a renamed one
                where, name = message
                close = difflib.get_close_matches(name, unused, n=1)
                hint = f" (closest: {close[0]!r})" if close else ""
                message = f"missing     {where}: no {name!r} in {label}{hint}"
            messages.append(message)
        for name in unused:
            stored = self.source.stored(name)
            assert stored is not None  # a name the catalog listed
            messages.append(
                f"unexpected  {name!r} ({stored.describe()}) in {label}: "
                "the template has no such path"
            )
        return LoadReport(
            tuple(self.missing), tuple(self.mismatched), tuple(unused), tuple(messages)
        )


def restore(like: Any, source: Catalog, strict: bool, action: str) -> Any:
    """`like` with its data from `source`: the tree, or `(tree, report)` if not `strict`."""
    found = entries(like, action, source.call.replace("like", "value"))
    checker = _Checker(like, source)
    decisions = [checker.decide(entry) for entry in found]
    report = checker.finish()
    if strict and report.messages:
        count = len(report.messages)
        raise ValueError(
            _DOES_NOT_FIT.format(
                source=source.title,
                root=root_name(like),
                count=count,
                s="" if count == 1 else "s",
                lines="\n".join("  " + line for line in report.messages),
                call=source.call,
                fixed=source.call[:-1] + ", strict=False)",
            )
        )
    steps = iter(zip(found, decisions))

    def visit(path: tuple, kind: str, value: Any) -> Any:
        entry, decision = next(steps)
        if decision == _KEEP:
            return value
        if entry.category == TENSOR:
            fetched = source.fetch(entry.name)
            return fetched if type(fetched) in NUMBERS else _place(value, fetched)
        if entry.category == NUMBER:
            return _to_number(value, source.fetch(entry.name))
        return source.fetch(entry.name)

    tree = _walk(like, visit, rebuild=True)
    return tree if strict else (tree, report)


def _place(template: Any, value: Any) -> Any:
    """`value` (checked to have the template's shape and dtype) as the template's type."""
    if isinstance(template, np.generic):
        return np.asarray(value)[()]
    if isinstance(template, np.ndarray):
        return np.asarray(value)
    sharding = None
    if isinstance(template, jax.ShapeDtypeStruct):
        sharding = template.sharding
    elif isinstance(template, jax.Array) and not isinstance(template, Tracer):
        if template.committed or len(template.sharding.device_set) > 1:
            sharding = template.sharding
    if sharding is not None:
        return jax.device_put(value, sharding)
    return value if isinstance(value, jax.Array) else jax.device_put(value)


def _number_fits(template: Any, stored: Stored) -> bool:
    """Whether the stored value converts exactly to the template's Python number type."""
    kind = type(template)
    if stored.category == TENSOR:
        if stored.shape != () or stored.dtype.startswith("key<"):
            return False
        dtype = numpy_dtype(stored.dtype)
        if dtype is None:
            return False
        if kind is bool:
            return dtype == np.bool_
        if kind is int:
            return bool(np.issubdtype(dtype, np.integer))
        wanted = np.floating if kind is float else np.inexact
        return bool(jnp.issubdtype(dtype, wanted))
    return stored.category == PLAIN and _to_number(template, stored.value) is not None


def _abstract_number_fits(template: Any, stored: Stored) -> bool:
    """A Python number saved where an abstract template has a scalar of its kind.

    `jax.eval_shape` turns a Python number into a weakly typed 0-d `ShapeDtypeStruct`,
    so an abstract template cannot say that the value was a number: the file can.
    """
    if not is_abstract(template) or template.shape != () or type(stored.value) not in NUMBERS:
        return False
    dtype = np.dtype(template.dtype) if not is_key_dtype(template.dtype) else None
    if dtype is None:
        return False
    kind = type(stored.value)
    if kind is bool:
        return dtype == np.bool_
    if kind is int:
        return bool(np.issubdtype(dtype, np.integer))
    wanted = np.floating if kind is float else np.complexfloating
    return bool(jnp.issubdtype(dtype, wanted))


def _to_number(template: Any, value: Any) -> Any:
    """`value` (a number or a 0-d array) as the template's Python type, or None."""
    kind = type(template)
    if isinstance(value, (jax.Array, np.ndarray, np.generic)):
        value = np.asarray(value).item()
    if type(value) is bool or kind is bool:
        return value if type(value) is kind else None
    allowed = {int: (int,), float: (int, float), complex: (int, float, complex)}[kind]
    return kind(value) if type(value) in allowed else None


def _same_value(a: Any, b: Any) -> bool:
    """Equal and of the same types, recursively; a NaN equals a NaN, 0.0 differs from -0.0."""
    if type(a) is not type(b):
        return False
    if type(a) in (tuple, list):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b))
    if type(a) is float:
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    if type(a) is complex:
        return _same_value(a.real, b.real) and _same_value(a.imag, b.imag)
    return a == b
