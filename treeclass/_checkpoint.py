"""Checkpoints: a tree's data as a state dict, or in one safetensors file. No pickle.

What is saved is decided by walking the tree with its frozen values as leaves, and into
every frozen subtree: every array (frozen or not) and numpy scalar is *data* and becomes a
tensor; Python numbers are data too; strings, `None` and tuples or lists of such plain
values (leaves, frozen values, static fields) are recorded; functions and other objects
are never saved: they come from the template given to `load` / `from_state_dict`, which
also decides the structure and what is frozen.

The file is plain safetensors: an 8-byte little-endian header length, a JSON header that
maps each tensor name to its dtype, shape and byte range, then the raw bytes in header
order. Tensor names are key paths joined with dots (`layers.0.weight`), the convention
of the model-weights ecosystem. The header's `__metadata__` (str -> str) holds one key,
`"treeclass"`, whose value is a JSON document:

    {"format": "treeclass", "version": 1, "root": "MLP",
     "tensors": {name: {"kind": ...}},                  # plus "dtype"/"shape" for raw bytes
     "values":  {name: {"kind": ..., "value": ...}},    # plain data, JSON-encoded
     "objects": {name: {"kind": ..., "type": ...}}}     # not saved: from the template

`kind` is `"leaf"`, `"frozen"` or `"static"`. dtypes without a safetensors name
(complex128, float8_e3m4, int4, PRNG keys, ...) are stored as raw little-endian bytes
(`U8` with a trailing itemsize axis; keys as their `uint32` key data) with the real dtype
in the document, so the file stays readable by other tools.

We write the format ourselves rather than through the `safetensors` package: it is not a
dependency of treeclass, its writers take every tensor in host memory at once (we move
one leaf at a time), its numpy reader has no bfloat16 or float8, and the format is small.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import math
import os
import secrets
import struct
from collections.abc import Callable, Iterator
from typing import Any, Literal, NamedTuple, NoReturn, TypeVar, overload

import jax
import jax.numpy as jnp
import ml_dtypes  # a dependency of jax: the bfloat16, float8 and int4 numpy dtypes
import numpy as np
from jax.core import Tracer

from . import _node
from ._frozen import freeze, is_frozen, unfreeze

__all__ = ["state_dict", "from_state_dict", "save", "load", "LoadReport"]

PyTree = Any
_T = TypeVar("_T")

_FORMAT_VERSION = 1
_METADATA_KEY = "treeclass"

# numpy dtype name -> safetensors dtype name, for the dtypes the format names
_SAFETENSORS_NAMES = {
    "bool": "BOOL", "uint8": "U8", "int8": "I8", "uint16": "U16", "int16": "I16",
    "uint32": "U32", "int32": "I32", "uint64": "U64", "int64": "I64",
    "float16": "F16", "bfloat16": "BF16", "float32": "F32", "float64": "F64",
    "complex64": "C64", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
    "float8_e4m3fnuz": "F8_E4M3FNUZ", "float8_e5m2fnuz": "F8_E5M2FNUZ",
    "float8_e8m0fnu": "F8_E8M0",
}  # fmt: skip
# dtypes the format names but numpy has no element type for (packed sub-byte floats):
# readable as unexpected tensors, never restorable
_PACKED_SAFETENSORS_NAMES = {"F4", "F6_E2M3", "F6_E3M2"}


def _numpy_dtype(name: str) -> np.dtype | None:
    try:
        return np.dtype(name)
    except TypeError:
        kind = getattr(ml_dtypes, name, None)
        return np.dtype(kind) if kind is not None else None


_DTYPES_OF_SAFETENSORS_NAMES = {
    code: dtype
    for name, code in _SAFETENSORS_NAMES.items()
    if (dtype := _numpy_dtype(name)) is not None
}


# --------------------------------------------------------------------------------------
# Walking a tree: leaves, frozen values (into frozen subtrees) and static fields
# --------------------------------------------------------------------------------------

_LEAF, _FROZEN, _STATIC = "leaf", "frozen", "static"
# what a value is to a checkpoint
_TENSOR, _NUMBER, _PLAIN, _OBJECT = "tensor", "number", "plain", "object"
_NUMBERS = (bool, int, float, complex)


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
            visit((*path, jax.tree_util.GetAttrKey(name)), _STATIC, value)

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
            new.append(visit(where, _FROZEN if frozen else _LEAF, x))
    if not rebuild:
        return None
    return treedef.unflatten(new)


def _category(value: Any) -> str:
    if isinstance(value, (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct)):
        return _TENSOR
    if type(value) in _NUMBERS:
        return _NUMBER
    if _is_plain(value):
        return _PLAIN
    return _OBJECT


def _is_plain(value: Any) -> bool:
    kind = type(value)
    if kind in (str, bool, int, float, complex) or value is None:
        return True
    return kind in (tuple, list) and all(_is_plain(x) for x in value)


def _is_abstract(value: Any) -> bool:
    return isinstance(value, (jax.ShapeDtypeStruct, Tracer))


def _key_name(key: Any) -> str:
    if isinstance(key, jax.tree_util.GetAttrKey):
        return key.name
    if isinstance(key, jax.tree_util.DictKey):
        return str(key.key)
    if isinstance(key, jax.tree_util.SequenceKey):
        return str(key.idx)
    if isinstance(key, jax.tree_util.FlattenedIndexKey):
        return str(key.key)
    return str(key)


def _state_key(key: Any) -> Any:
    if isinstance(key, jax.tree_util.GetAttrKey):
        return key.name
    if isinstance(key, jax.tree_util.DictKey):
        return key.key
    if isinstance(key, jax.tree_util.SequenceKey):
        return key.idx
    if isinstance(key, jax.tree_util.FlattenedIndexKey):
        return key.key
    return str(key)


def _path_str(root: Any, path: tuple) -> str:
    """A key path as the rest of treeclass prints it: the root's class name, then keystr."""
    cls = type(root)
    prefix = cls.__name__ if cls.__module__ != "builtins" else "tree"
    return prefix + jax.tree_util.keystr(path)


class _Entry(NamedTuple):
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


def _entries(tree: Any, action: str, call: str) -> list[_Entry]:
    """Every leaf, frozen leaf and static field of `tree`, named; `call` shows `action`'s
    call with the tree as `value`, for the message that a single leaf gets."""
    found: list[_Entry] = []

    def visit(path: tuple, kind: str, value: Any) -> None:
        if not path:
            fixed = call.replace("value", "{'value': value}")
            raise ValueError(
                _NO_KEYS.format(action=action, type=type(value).__name__, call=call, fixed=fixed)
            )
        name = ".".join(_key_name(key) for key in path)
        found.append(_Entry(path, kind, value, name, _category(value)))

    _walk(tree, visit, rebuild=False)
    seen: dict[str, _Entry] = {}
    for entry in found:
        other = seen.setdefault(entry.name, entry)
        if other is not entry:
            raise ValueError(
                _SAME_NAME.format(
                    name=entry.name,
                    first=_path_str(tree, other.path),
                    second=_path_str(tree, entry.path),
                )
            )
    return found


# --------------------------------------------------------------------------------------
# dtypes, shapes and how values are described in messages
# --------------------------------------------------------------------------------------


def _is_key_dtype(dtype: Any) -> bool:
    return jnp.issubdtype(dtype, jax.dtypes.prng_key)


def _dtype_name(dtype: Any) -> str:
    return str(dtype) if _is_key_dtype(dtype) else np.dtype(dtype).name


def _describe_array(dtype_name: str, shape: tuple) -> str:
    return f"{dtype_name}[{','.join(map(str, shape))}]"


def _describe(value: Any) -> str:
    if _category(value) == _TENSOR:
        return "an array " + _describe_array(_dtype_name(value.dtype), tuple(value.shape))
    if _is_plain(value):
        text = repr(value)
        text = text if len(text) <= 40 else text[:37] + "..."
        return f"{type(value).__name__} {text}"
    return f"a {type(value).__name__} (not data)"


# --------------------------------------------------------------------------------------
# state_dict / from_state_dict
# --------------------------------------------------------------------------------------


def state_dict(tree: PyTree) -> dict:
    """The data of `tree` as a plain nested dict: the shape orbax and flax-style tools expect.

    Keys are field names, dict keys and sequence indices (as ints). Values are every array
    leaf, every frozen array (unfrozen, as an array; also inside frozen subtrees), numpy
    scalars and Python numbers that are leaves or frozen. Strings, functions, other
    objects and static fields are not data: `from_state_dict` takes them from its
    template. Arrays are not copied. On an abstract tree (from `jax.eval_shape`) the
    values are `jax.ShapeDtypeStruct`s: a restore target for orbax.

    **Arguments**

    - `tree`: any pytree, possibly holding `TreeClass` instances and frozen values.

    **Returns**

    A nested `dict`; nodes without data (a layer of strings only) do not appear.

    ```python
    import jax.numpy as jnp
    import treeclass as tc

    class Linear(tc.TreeClass):
        weight: jnp.ndarray
        table: object
        act: object = tc.freeze("tanh")
        name: str = tc.field(default="linear", static=True)

    model = {"layers": [Linear(jnp.ones((2, 2)), tc.freeze(jnp.arange(3)))], "step": 7}
    state = tc.state_dict(model)
    assert list(state["layers"][0]) == ["weight", "table"]
    assert state["step"] == 7 and state["layers"][0]["table"].shape == (3,)
    ```
    """
    out: dict = {}
    for entry in _entries(tree, "tc.state_dict", "tc.state_dict(value)"):
        if entry.kind == _STATIC or entry.category not in (_TENSOR, _NUMBER):
            continue
        value = entry.value
        if isinstance(value, Tracer):  # a frozen array of an abstract model
            value = jax.ShapeDtypeStruct(value.shape, value.dtype)
        node = out
        for key in entry.path[:-1]:
            node = node.setdefault(_state_key(key), {})
        node[_state_key(entry.path[-1])] = value
    return out


@overload
def from_state_dict(like: _T, state: dict, *, strict: Literal[True] = True) -> _T: ...
@overload
def from_state_dict(like: _T, state: dict, *, strict: Literal[False]) -> tuple[_T, LoadReport]: ...
@overload
def from_state_dict(like: _T, state: dict, *, strict: bool) -> _T | tuple[_T, LoadReport]: ...
def from_state_dict(like: PyTree, state: dict, *, strict: bool = True) -> Any:
    """The inverse of `state_dict`: `like` with its data taken from `state`.

    The template `like` gives the structure, what is frozen (restored values are frozen
    again), static fields and every value that is not data (strings, functions).
    Arrays take the template's type: a numpy array for a numpy leaf, a `jax.Array` placed
    with the template's sharding for a `jax.Array` or a `jax.ShapeDtypeStruct` with a
    `sharding` (arrays in `state` already placed that way are used as they are). Keys
    that are ints in `like` may be strings in `state` (orbax restores them so).

    **Arguments**

    - `like`: a tree of the right structure: a model, or an abstract one from
      `jax.eval_shape`.
    - `state`: a nested dict as made by `state_dict` (or restored by orbax).
    - `strict`: if True, any missing key, unexpected key, or shape, dtype or type
      mismatch raises. If False, restore what fits.

    **Returns**

    The restored tree; with `strict=False`, a pair `(tree, report)` where `report` is a
    `LoadReport` (see `load`).

    **Raises**

    `ValueError` naming every key path that does not fit (with `strict=True`).

    ```python
    import jax.numpy as jnp
    import treeclass as tc

    model = {"w": jnp.ones(2), "table": tc.freeze(jnp.arange(3)), "act": tc.freeze("tanh")}
    state = tc.state_dict(model)
    state["w"] = state["w"] * 2
    restored = tc.from_state_dict(model, state)
    assert restored["w"].tolist() == [2.0, 2.0] and tc.is_frozen(restored["table"])

    restored, report = tc.from_state_dict(model, {"w": jnp.zeros(2)}, strict=False)
    assert report.missing == ("tree['table']",)
    ```
    """
    if not isinstance(state, dict):
        raise TypeError(
            f"tc.from_state_dict expects a dict as made by tc.state_dict, got a "
            f"{type(state).__name__}"
        )
    return _restore(like, _StateSource(state), strict)


# --------------------------------------------------------------------------------------
# Sources: a state dict or a file, seen by name
# --------------------------------------------------------------------------------------


class _Stored(NamedTuple):
    """What a source holds under one name, as the checks see it."""

    category: str  # tensor or plain (a number or another plain value) or object
    dtype: str = ""  # tensors: the dtype's name ("float32", "key<fry>")
    shape: tuple = ()
    value: Any = None  # plain values: the value; objects: the type's name

    def describe(self) -> str:
        if self.category == _TENSOR:
            return "an array " + _describe_array(self.dtype, self.shape)
        if self.category == _OBJECT:
            return f"a {self.value} (not saved)"
        return _describe(self.value)


class _StateSource:
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

    def stored(self, name: str) -> _Stored | None:
        if name not in self.values:
            return None
        value = self.values[name]
        if _category(value) == _TENSOR:
            return _Stored(_TENSOR, _dtype_name(value.dtype), tuple(value.shape))
        return _Stored(_PLAIN, value=value)

    def fetch(self, name: str) -> Any:
        return self.values[name]


_NOT_A_CHECKPOINT = (
    "{path} is not a checkpoint tc.load can read: {reason}. The file is corrupted or "
    "truncated (an interrupted copy?), or it is not a safetensors file."
)


class _FileTensor(NamedTuple):
    code: str  # the safetensors dtype name
    shape: tuple  # the shape in the file
    start: int
    stop: int
    dtype: str  # the restored dtype's name
    true_shape: tuple  # the restored shape (raw bytes have an extra axis)
    key_impl: str | None


class _FileSource:
    label = "the file"
    call = "tc.load(path, like)"

    def __init__(self, file: Any, path: str) -> None:
        self.file = file
        self.path = path
        self.title = f"The checkpoint {path}"
        size = os.fstat(file.fileno()).st_size
        head = file.read(8)
        if len(head) < 8:
            self._corrupt(f"it has {size} bytes, fewer than a safetensors header needs")
        (length,) = struct.unpack("<Q", head)
        if length > size - 8:
            self._corrupt(f"its header claims {length} bytes, but the file has {size}")
        try:
            header = json.loads(file.read(length).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            self._corrupt(f"its header is not valid JSON ({error})")
        if not isinstance(header, dict):
            self._corrupt("its header is not a JSON object")
        self.data_start = 8 + length
        metadata = header.pop("__metadata__", None) or {}
        if not isinstance(metadata, dict):
            self._corrupt("its __metadata__ is not a JSON object")
        document = self._document(metadata)
        self.records_values = document is not None
        document = document or {}
        self.root = document.get("root")
        raw = document.get("tensors", {})
        self.tensors = {
            name: self._tensor(name, info, raw.get(name)) for name, info in header.items()
        }
        self._check_layout(size - self.data_start)
        try:
            records = document.get("values", {})
            self.values = {name: _decode(record["value"]) for name, record in records.items()}
        except (KeyError, TypeError, ValueError) as error:
            self._corrupt(f"a value in its treeclass metadata is malformed ({error!r})")
        self.objects = {
            name: str(record.get("type")) for name, record in document.get("objects", {}).items()
        }

    def _corrupt(self, reason: str) -> NoReturn:
        raise ValueError(_NOT_A_CHECKPOINT.format(path=self.path, reason=reason))

    def _document(self, metadata: dict) -> dict | None:
        text = metadata.get(_METADATA_KEY)
        if text is None:
            return None  # written by another tool: tensors only
        try:
            document = json.loads(text)
        except (TypeError, json.JSONDecodeError) as error:
            self._corrupt(f"its treeclass metadata is not valid JSON ({error})")
        if not isinstance(document, dict) or document.get("format") != "treeclass":
            self._corrupt("its treeclass metadata is not a treeclass document")
        if document.get("version") != _FORMAT_VERSION:
            raise ValueError(
                f"{self.path} was written by a treeclass with checkpoint format version "
                f"{document.get('version')}; this treeclass reads version {_FORMAT_VERSION}. "
                "Upgrade treeclass."
            )
        for part in ("tensors", "values", "objects"):
            records = document.get(part, {})
            if not isinstance(records, dict) or not all(
                isinstance(r, dict) for r in records.values()
            ):
                self._corrupt(f"the {part!r} of its treeclass metadata are malformed")
        return document

    def _tensor(self, name: str, info: Any, raw: dict | None) -> _FileTensor:
        try:
            code, shape, (start, stop) = info["dtype"], info["shape"], info["data_offsets"]
            shape = tuple(shape)
            ok = all(type(n) is int and n >= 0 for n in (*shape, start, stop)) and start <= stop
        except (TypeError, KeyError, ValueError):
            ok, start, stop = False, 0, 0  # bound for type checkers: `_corrupt` raises below
        if not ok:
            self._corrupt(f"the header entry of tensor {name!r} is malformed: {info!r}")
        if code in _PACKED_SAFETENSORS_NAMES:
            return _FileTensor(code, shape, start, stop, code, shape, None)
        dtype = _DTYPES_OF_SAFETENSORS_NAMES.get(code)
        if dtype is None:
            self._corrupt(f"tensor {name!r} has the unknown dtype {code!r}")
        if stop - start != math.prod(shape) * dtype.itemsize:
            self._corrupt(
                f"tensor {name!r} is {code}{list(shape)}, which needs "
                f"{math.prod(shape) * dtype.itemsize} bytes, but its byte range holds "
                f"{stop - start}"
            )
        if raw is None or "dtype" not in raw:
            return _FileTensor(code, shape, start, stop, dtype.name, shape, None)
        # stored as raw bytes (or key data): the true dtype and shape are in the metadata
        try:
            true_dtype, true_shape, impl = str(raw["dtype"]), tuple(raw["shape"]), raw.get("impl")
            if impl is not None:  # PRNG keys: their uint32 key data, one more axis
                ok = code == "U32" and shape[:-1] == true_shape and isinstance(impl, str)
            else:  # raw bytes: uint8, an axis of itemsize more
                base = _numpy_dtype(true_dtype)
                ok = code == "U8" and base is not None and shape == (*true_shape, base.itemsize)
        except (KeyError, TypeError, ValueError):
            ok = False
        if not ok:
            self._corrupt(f"the treeclass record of tensor {name!r} is malformed: {raw!r}")
        return _FileTensor(code, shape, start, stop, true_dtype, true_shape, impl)

    def _check_layout(self, data_size: int) -> None:
        # the format's rule: the byte ranges tile the data section, without holes
        end = 0
        for name, tensor in sorted(self.tensors.items(), key=lambda kv: kv[1][2:4]):
            if tensor.start != end:
                self._corrupt(
                    f"tensor {name!r} starts at byte {tensor.start} of the data, expected {end}"
                )
            end = tensor.stop
        if end > data_size:
            self._corrupt(
                f"its header describes {end} bytes of tensor data, but only {data_size} "
                "follow it: the file is truncated"
            )
        if end < data_size:
            self._corrupt(f"{data_size - end} bytes follow the last tensor's data")

    def names(self) -> Iterator[str]:
        yield from self.tensors
        yield from self.values
        yield from self.objects

    def stored(self, name: str) -> _Stored | None:
        tensor = self.tensors.get(name)
        if tensor is not None:
            return _Stored(_TENSOR, tensor.dtype, tensor.true_shape)
        if name in self.values:
            return _Stored(_PLAIN, value=self.values[name])
        if name in self.objects:
            return _Stored(_OBJECT, value=self.objects[name])
        return None

    def fetch(self, name: str) -> Any:
        tensor = self.tensors.get(name)
        if tensor is None:
            return self.values[name]
        buffer = np.empty(tensor.stop - tensor.start, np.uint8)
        self.file.seek(self.data_start + tensor.start)
        view, done = buffer.data, 0
        while done < len(buffer):
            count = self.file.readinto(view[done:])
            if not count:
                self._corrupt(f"it ended inside the data of tensor {name!r}")
            done += count
        if tensor.key_impl:
            data = buffer.view(np.dtype("<u4")).reshape(tensor.shape)
            # (jax takes a NumPy array here; its annotation says `Array`)
            return jax.random.wrap_key_data(data, impl=tensor.key_impl)  # type: ignore[arg-type]
        dtype = _numpy_dtype(tensor.dtype)
        assert dtype is not None  # the header's dtypes were checked when the file was opened
        return buffer.view(dtype.newbyteorder("<")).reshape(tensor.true_shape)


# --------------------------------------------------------------------------------------
# Restoring a template from a source
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

# what to do with a template entry: take the value from the source, or keep the template's
_TAKE, _KEEP = "take", "keep"


class _Checker:
    """Compares every template entry with the source, collecting all problems at once."""

    def __init__(self, like: Any, source: Any) -> None:
        self.like = like
        self.source = source
        self.used: set[str] = set()
        self.missing: list[str] = []
        self.mismatched: list[str] = []
        self.messages: list[Any] = []  # lines, or (path, name) of a missing entry

    def decide(self, entry: _Entry) -> str:
        stored = self.source.stored(entry.name)
        if stored is not None:
            self.used.add(entry.name)
        where = _path_str(self.like, entry.path)
        if entry.category == _OBJECT:
            # functions and other objects come from the template; an array in their place
            # means the structure changed
            if stored is not None and stored.category == _TENSOR:
                return self._mismatch(where, entry.value, stored, "type")
            return _KEEP
        if entry.kind == _STATIC:
            if not _is_plain(entry.value):
                return _KEEP  # not recorded (a function, a class): nothing to check
            if stored is None:
                return self._missing(where, entry) if self.source.records_values else _KEEP
            if stored.category == _PLAIN and _same_value(entry.value, stored.value):
                return _KEEP
            return self._mismatch(where, entry.value, stored, "static")
        if stored is None:
            if entry.category == _PLAIN and not self.source.records_values:
                return _KEEP  # strings are not in state dicts or other tools' files
            return self._missing(where, entry)
        if entry.category == _TENSOR:
            if stored.category != _TENSOR:
                if _abstract_number_fits(entry.value, stored):
                    return _TAKE
                return self._mismatch(where, entry.value, stored, "type")
            dtype, shape = _dtype_name(entry.value.dtype), tuple(entry.value.shape)
            if stored.shape != shape:
                return self._mismatch(where, entry.value, stored, "shape")
            if stored.dtype != dtype:
                return self._mismatch(where, entry.value, stored, "dtype")
            return _TAKE
        if entry.category == _NUMBER:
            if not _number_fits(entry.value, stored):
                return self._mismatch(where, entry.value, stored, "type")
            return _TAKE
        if stored.category == _PLAIN and type(stored.value) is type(entry.value):
            return _TAKE
        return self._mismatch(where, entry.value, stored, "type")

    def _missing(self, where: str, entry: _Entry) -> str:
        self.missing.append(where)
        # the hint is added by `finish`, which knows which names no entry used
        self.messages.append((where, entry.name))
        return _KEEP

    def _mismatch(self, where: str, value: Any, stored: _Stored, what: str) -> str:
        self.mismatched.append(where)
        self.messages.append(
            f"{what:<11} {where}: {_describe(value)} in the template, {stored.describe()} "
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
            messages.append(
                f"unexpected  {name!r} ({self.source.stored(name).describe()}) in {label}: "
                "the template has no such path"
            )
        return LoadReport(
            tuple(self.missing), tuple(self.mismatched), tuple(unused), tuple(messages)
        )


def _restore(like: Any, source: Any, strict: bool) -> Any:
    action = "tc.load" if isinstance(source, _FileSource) else "tc.from_state_dict"
    entries = _entries(like, action, source.call.replace("like", "value"))
    checker = _Checker(like, source)
    decisions = [checker.decide(entry) for entry in entries]
    report = checker.finish()
    if strict and report.messages:
        count = len(report.messages)
        raise ValueError(
            _DOES_NOT_FIT.format(
                source=source.title,
                root=_path_str(like, ()),
                count=count,
                s="" if count == 1 else "s",
                lines="\n".join("  " + line for line in report.messages),
                call=source.call,
                fixed=source.call[:-1] + ", strict=False)",
            )
        )
    steps = iter(zip(entries, decisions))

    def visit(path: tuple, kind: str, value: Any) -> Any:
        entry, decision = next(steps)
        if decision == _KEEP:
            return value
        if entry.category == _TENSOR:
            fetched = source.fetch(entry.name)
            return fetched if type(fetched) in _NUMBERS else _place(value, fetched)
        if entry.category == _NUMBER:
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


def _number_fits(template: Any, stored: _Stored) -> bool:
    """Whether the stored value converts exactly to the template's Python number type."""
    kind = type(template)
    if stored.category == _TENSOR:
        if stored.shape != () or stored.dtype.startswith("key<"):
            return False
        dtype = _numpy_dtype(stored.dtype)
        if dtype is None:
            return False
        if kind is bool:
            return dtype == np.bool_
        if kind is int:
            return bool(np.issubdtype(dtype, np.integer))
        wanted = np.floating if kind is float else np.inexact
        return bool(jnp.issubdtype(dtype, wanted))
    return stored.category == _PLAIN and _to_number(template, stored.value) is not None


def _abstract_number_fits(template: Any, stored: _Stored) -> bool:
    """A Python number saved where an abstract template has a scalar of its kind.

    `jax.eval_shape` turns a Python number into a weakly typed 0-d `ShapeDtypeStruct`,
    so an abstract template cannot say that the value was a number: the file can.
    """
    if not _is_abstract(template) or template.shape != () or type(stored.value) not in _NUMBERS:
        return False
    dtype = np.dtype(template.dtype) if not _is_key_dtype(template.dtype) else None
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


# --------------------------------------------------------------------------------------
# Plain values in the metadata: JSON, with tags for what JSON cannot tell apart
# --------------------------------------------------------------------------------------


def _encode(value: Any) -> Any:
    kind = type(value)
    if value is None or kind in (bool, int, str):
        return value
    if kind is float:
        # JSON has no NaN or infinity; repr gives "nan", "inf", "-inf" and float() reads them
        return value if math.isfinite(value) else {"float": repr(value)}
    if kind is complex:
        return {"complex": [_encode(value.real), _encode(value.imag)]}
    if kind is tuple:
        return {"tuple": [_encode(x) for x in value]}
    return [_encode(x) for x in value]  # a list; `_is_plain` allows nothing else


def _decode(data: Any) -> Any:
    if isinstance(data, list):
        return [_decode(x) for x in data]
    if isinstance(data, dict):
        ((tag, inner),) = data.items()
        if tag == "float":
            return float(inner)
        if tag == "complex":
            real, imag = inner
            return complex(_decode(real), _decode(imag))
        if tag == "tuple":
            return tuple(_decode(x) for x in inner)
        raise ValueError(f"unknown tag {tag!r}")
    return data


# --------------------------------------------------------------------------------------
# save / load
# --------------------------------------------------------------------------------------

_ABSTRACT_LEAF = (
    "tc.save got an abstract value at {where} ({value}): there is no data to save. Save "
    "the model itself, not its `jax.eval_shape` template."
)
_NOT_ADDRESSABLE = (
    "tc.save cannot save {where}: the array is sharded over devices of other processes, "
    "so this process cannot read all of it. For multi-host checkpoints use orbax:\n"
    "    ocp.StandardCheckpointer().save(directory, tc.state_dict(model))\n"
    "and restore with `tc.from_state_dict(like, restored)`."
)
_UNSAVABLE_DTYPE = "tc.save cannot save {where}: its dtype {dtype} has no fixed-size bytes."
_RESERVED_NAME = (
    "tc.save cannot name a tensor `__metadata__` (at {where}): the safetensors format "
    "reserves that name. Rename the key."
)


class _PlannedTensor(NamedTuple):
    name: str
    value: Any
    code: str
    shape: tuple  # as stored
    nbytes: int
    record: dict  # the tensor's part of the treeclass metadata


def _plan_tensor(tree: Any, entry: _Entry) -> _PlannedTensor:
    value, where = entry.value, _path_str(tree, entry.path)
    if _is_abstract(value):
        raise ValueError(_ABSTRACT_LEAF.format(where=where, value=_describe(value)))
    if isinstance(value, jax.Array) and not value.is_fully_addressable:
        raise ValueError(_NOT_ADDRESSABLE.format(where=where))
    if entry.name == "__metadata__":
        raise ValueError(_RESERVED_NAME.format(where=where))
    shape = tuple(value.shape)
    record: dict[str, Any] = {"kind": entry.kind}
    if _is_key_dtype(value.dtype):
        stored = jax.eval_shape(jax.random.key_data, value).shape
        record.update(dtype=str(value.dtype), shape=list(shape))
        record["impl"] = str(jax.random.key_impl(value))
        return _PlannedTensor(entry.name, value, "U32", stored, 4 * math.prod(stored), record)
    dtype = np.dtype(value.dtype)
    code = _SAFETENSORS_NAMES.get(dtype.name)
    if code is not None:
        return _PlannedTensor(
            entry.name, value, code, shape, dtype.itemsize * math.prod(shape), record
        )
    if dtype.hasobject or dtype.kind in "OSUMm" or _numpy_dtype(dtype.name) != dtype:
        raise ValueError(_UNSAVABLE_DTYPE.format(where=where, dtype=dtype))
    # no safetensors name: raw bytes, one more axis for the bytes of an element
    stored = (*shape, dtype.itemsize)
    record.update(dtype=dtype.name, shape=list(shape))
    return _PlannedTensor(entry.name, value, "U8", stored, math.prod(stored), record)


def _header(tree: Any, entries: list[_Entry]) -> tuple[bytes, list[_PlannedTensor]]:
    tensors: list[_PlannedTensor] = []
    values: dict[str, dict] = {}
    objects: dict[str, dict] = {}
    for entry in entries:
        if entry.category == _TENSOR and entry.kind != _STATIC:
            tensors.append(_plan_tensor(tree, entry))
        elif entry.category in (_NUMBER, _PLAIN):
            values[entry.name] = {"kind": entry.kind, "value": _encode(entry.value)}
        else:
            objects[entry.name] = {"kind": entry.kind, "type": type(entry.value).__name__}
    root = type(tree)
    document = {
        "format": "treeclass",
        "version": _FORMAT_VERSION,
        "root": root.__name__ if root.__module__ != "builtins" else "tree",
        "tensors": {t.name: t.record for t in tensors},
        "values": values,
        "objects": objects,
    }
    header: dict[str, Any] = {
        "__metadata__": {_METADATA_KEY: json.dumps(document, separators=(",", ":"))}
    }
    offset = 0
    for t in tensors:
        header[t.name] = {
            "dtype": t.code,
            "shape": list(t.shape),
            "data_offsets": [offset, offset + t.nbytes],
        }
        offset += t.nbytes
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as the format allows
    return struct.pack("<Q", len(text)) + text, tensors


def _host_bytes(value: Any) -> np.ndarray:
    """One leaf's bytes on the host, little-endian, as a flat uint8 array."""
    if isinstance(value, jax.Array) and _is_key_dtype(value.dtype):
        value = jax.random.key_data(value)
    host = np.ascontiguousarray(np.asarray(value))  # a device array is copied here, alone
    if host.dtype.byteorder == ">":
        host = host.astype(host.dtype.newbyteorder("<"))
    return host.reshape(-1).view(np.uint8)


def save(path: str | os.PathLike, tree: PyTree) -> None:
    """Save `tree` to one safetensors file at `path`, without pickle.

    Every array (frozen ones too) and numpy scalar is a tensor named by its key path
    joined with dots (`layers.0.weight`); any dtype round-trips bit-exactly. Python
    numbers, strings, `None` and tuples or lists of them (leaves, frozen values and
    static fields) go into the header's metadata as JSON, so `load` can restore them and
    check the template's static values. Functions and other objects are not saved: `load`
    takes them from its template.

    The file is written to a temporary file in the same folder and then renamed over
    `path`: if saving fails or the process dies, `path` still holds the previous
    checkpoint. Arrays are copied to the host one at a time, so the extra host memory
    stays near the size of the largest leaf.

    **Arguments**

    - `path`: the file to write (by convention `*.safetensors`); its folder must exist.
    - `tree`: any pytree of arrays, numbers and TreeClass instances. Sharded arrays are
      gathered to this host; use orbax for arrays spread over several hosts.

    **Returns**

    None.

    **Raises**

    `ValueError` for an abstract value (a `jax.ShapeDtypeStruct`), an array this process
    cannot read whole, or two key paths with the same name; the file is untouched.

    ```python
    import os, tempfile
    import jax.numpy as jnp
    import treeclass as tc

    model = {"w": jnp.ones((2, 3), jnp.bfloat16), "step": 10, "act": tc.freeze("relu")}
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "model.safetensors")
        tc.save(path, model)
        restored = tc.load(path, model)
    assert tc.is_tree_equal(restored, model)
    ```
    """
    path = os.fspath(path)
    head, tensors = _header(tree, _entries(tree, "tc.save", "tc.save(path, value)"))
    folder, base = os.path.split(os.path.abspath(path))
    temp = os.path.join(folder, f".{base}.{secrets.token_hex(6)}.tmp")
    # O_EXCL: never write into a file someone else made; mode 0o666 minus the umask, as
    # for any new file (mkstemp would make it 0o600)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    descriptor = os.open(temp, flags, 0o666)
    try:
        with open(descriptor, "wb") as file:
            file.write(head)
            for tensor in tensors:
                data = _host_bytes(tensor.value)
                if data.nbytes != tensor.nbytes:  # the tree changed under us
                    raise ValueError(f"{tensor.name!r} changed size while being saved")
                file.write(data.data)
                del data  # free this leaf's host copy before the next is made
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


@overload
def load(path: str | os.PathLike, like: _T, *, strict: Literal[True] = True) -> _T: ...
@overload
def load(path: str | os.PathLike, like: _T, *, strict: Literal[False]) -> tuple[_T, LoadReport]: ...
@overload
def load(path: str | os.PathLike, like: _T, *, strict: bool) -> _T | tuple[_T, LoadReport]: ...
def load(path: str | os.PathLike, like: PyTree, *, strict: bool = True) -> Any:
    """Load the checkpoint at `path` into the template `like`.

    The template gives the structure, what is frozen (restored values are frozen again),
    and every value the file does not hold (functions, objects); the file gives the data,
    strings and frozen values, and is checked against the template's static values.
    Arrays take the template's type: numpy for a numpy leaf, else a `jax.Array` placed
    like the template's leaf: with the `sharding` of a `jax.ShapeDtypeStruct`, the
    sharding of a committed or sharded `jax.Array`, or on the default device. With an
    abstract template (`jax.eval_shape(lambda: Model(...))`) nothing is allocated twice:
    each tensor is read into one host buffer and placed from there.

    A file written by another tool (plain safetensors, no treeclass metadata) loads too
    when its tensor names are the template's key paths joined with dots; values other
    than numbers then come from the template.

    **Arguments**

    - `path`: a file written by `save`, or any safetensors file.
    - `like`: a tree of the right structure: a model, or an abstract one.
    - `strict`: if True (the default), any missing or unexpected key, shape, dtype or
      type mismatch, or differing static value raises one `ValueError` naming every key
      path. If False, restore what fits and report the rest.

    **Returns**

    The restored tree. With `strict=False`, a pair `(tree, report)`; `report` is a
    `NamedTuple` with `missing` and `mismatched` (the template's key paths, like
    `MLP.layers[0].weight`, left at the template's values; `kept` is both), `unexpected`
    (names in the file, like `layers.2.weight`, that were ignored) and `messages` (one
    line per problem). A path left at the value of an abstract template stays a
    `jax.ShapeDtypeStruct`.

    **Raises**

    `ValueError` for a corrupted or truncated file, whatever `strict` is; nothing is
    returned in part.

    ```python
    import os, tempfile
    import jax, jax.numpy as jnp
    import treeclass as tc

    class Linear(tc.TreeClass):
        weight: jax.Array
        bias: jax.Array

    model = Linear(jnp.ones((3, 2)), jnp.zeros(2))
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "linear.safetensors")
        tc.save(path, model)
        abstract = jax.eval_shape(lambda: Linear(jnp.zeros((3, 2)), jnp.zeros(2)))
        restored = tc.load(path, abstract)
        bigger = jax.eval_shape(lambda: Linear(jnp.zeros((3, 4)), jnp.zeros(4)))
        partial, report = tc.load(path, bigger, strict=False)
    assert tc.is_tree_equal(restored, model)
    assert report.mismatched == ("Linear.weight", "Linear.bias")
    ```
    """
    path = os.fspath(path)
    with open(path, "rb") as file:
        return _restore(like, _FileSource(file, path), strict)
