"""treeclass's own metadata in a checkpoint (safetensors: under `"treeclass"`), a JSON
document: `{"format": "treeclass", "version": 1, "root": "MLP", "tensors": {name:
{"kind", ...}}, "values": {name: {"kind", "value"}}, "objects": {name: {"kind", "type"}},
"versions": {class: {"version", "at"}}}`, `kind` being leaf, frozen or static. A dtype
the format cannot name (complex128, int4, PRNG keys) is stored as raw little-endian bytes
(`uint8`, one more axis; keys as `uint32` key data), its true dtype and shape in the
record. `plan` makes it for a save; `SourceCatalog` reads any source with it.
"""

from __future__ import annotations

import functools
import json
import math
import struct
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, NoReturn

import jax
import ml_dtypes  # a dependency of jax: the int4 and float4 dtypes
import numpy as np

from ..._values import host_bytes, is_prng_key, path_str, root_name
from ..files._json import loads as strict_json
from ..files._processes import host_view
from ..files._source import CheckpointSource, PlannedTensor, corrupt, is_weak, numpy_dtype
from ._catalog import Stored, describe
from ._versions import class_versions
from ._walk import NO_DATA, NUMBER, OBJECT, PLAIN, TENSOR, Entry, entries, is_abstract

FORMAT_VERSION = 1
METADATA_KEY = "treeclass"


def _encode(value: Any) -> Any:
    kind = type(value)
    if value is None or kind in (bool, int, str):
        return value
    if kind is float:
        # JSON has no NaN or infinity; repr gives "nan", "inf", "-inf" and float() reads them
        if math.isnan(value):  # by its bits: NaNs differ in sign and payload, and so do keys
            return {"float": "nan:" + struct.pack("<d", value).hex()}
        return value if math.isfinite(value) else {"float": repr(value)}
    if kind is complex:
        return {"complex": [_encode(value.real), _encode(value.imag)]}
    if kind is tuple:
        return {"tuple": [_encode(x) for x in value]}
    return [_encode(x) for x in value]  # a list; `is_plain` allows nothing else


def _decode(data: Any) -> Any:
    if isinstance(data, list):
        return [_decode(x) for x in data]
    if isinstance(data, dict):
        ((tag, inner),) = data.items()
        if tag == "float":  # "inf", "-inf", or "nan:" and the NaN's bits in hex
            if inner in ("inf", "-inf"):
                return float(inner)
            text = inner[4:] if isinstance(inner, str) and inner.startswith("nan:") else ""
            bits = bytes.fromhex(text)
            value = struct.unpack("<d", bits)[0] if len(bits) == 8 else 0.0
            if not math.isnan(value):
                raise ValueError(f"malformed float {inner!r}")
            return value
        if tag == "complex":
            real, imag = inner
            return complex(_decode(real), _decode(imag))
        if tag == "tuple":
            return tuple(_decode(x) for x in inner)
        raise ValueError(f"unknown tag {tag!r}")
    return data


_UNSAVABLE_DTYPE = "the array at {where} has the dtype {dtype}, which has no fixed-size bytes"
_RESERVED_NAME = (
    "a tensor cannot be named `__metadata__` (at {where}): the safetensors format reserves "
    "that name. Rename the key."
)


def _plan_tensor(tree: Any, entry: Entry, storable: Callable[[np.dtype], bool]) -> PlannedTensor:
    value, where = entry.value, path_str(tree, entry.path)
    if is_abstract(value):
        raise ValueError(NO_DATA.format(where=where, value=describe(value)))
    data = value  # what the writer reads: for an array spread over processes, a view of it
    if isinstance(value, jax.Array) and not value.is_fully_addressable:
        data = host_view(value, where)
    if entry.name == "__metadata__":
        raise ValueError(_RESERVED_NAME.format(where=where))
    shape = tuple(value.shape)
    record: dict[str, Any] = {"kind": entry.kind}
    if is_weak(value):
        record["weak"] = True
    dtype: np.dtype
    if is_prng_key(value):  # its uint32 key data, one more axis
        record.update(dtype=str(value.dtype), shape=list(shape))
        record["impl"] = str(jax.random.key_impl(value))
        dtype, stored = np.dtype("uint32"), jax.eval_shape(jax.random.key_data, value).shape
    else:
        dtype = np.dtype(value.dtype)
        if dtype.byteorder == ">":  # written little-endian, as the format says (`tensor_bytes`)
            dtype = dtype.newbyteorder("<")
        stored = shape
        if not storable(dtype):  # no name in the format: raw bytes, one more axis
            if dtype.hasobject or dtype.kind in "OSUMm" or numpy_dtype(dtype.name) != dtype:
                raise ValueError(_UNSAVABLE_DTYPE.format(where=where, dtype=dtype))
            record.update(dtype=dtype.name, shape=list(shape))
            dtype, stored = np.dtype("uint8"), (*shape, dtype.itemsize)
    nbytes = dtype.itemsize * math.prod(stored)
    return PlannedTensor(entry.name, data, dtype, tuple(stored), nbytes, record, where)


def tensor_bytes(value: Any) -> np.ndarray:
    """The bytes to write for a value: flat `uint8`, little-endian."""
    if isinstance(value, np.ndarray) and value.dtype.byteorder == ">":
        value = value.astype(value.dtype.newbyteorder("<"))  # this array's copy alone
    return host_bytes(value)


def plan(tree: Any, storable: Callable[[np.dtype], bool]) -> tuple[str, list[PlannedTensor]]:
    """The treeclass document of `tree` and its tensors in writing order."""
    tensors: list[PlannedTensor] = []
    values: dict[str, dict] = {}
    objects: dict[str, dict] = {}
    for entry in entries(tree, "tc.save", "tc.save(path, value)", to_file=True):
        if entry.category == TENSOR:  # static arrays too: loading compares them
            tensors.append(_plan_tensor(tree, entry, storable))
        elif entry.category in (NUMBER, PLAIN):
            values[entry.name] = {"kind": entry.kind, "value": _encode(entry.value)}
        else:
            objects[entry.name] = {"kind": entry.kind, "type": type(entry.value).__name__}
    document = {
        "format": "treeclass",
        "version": FORMAT_VERSION,
        "root": root_name(tree),
        "tensors": {t.name: t.record for t in tensors},
        "values": values,
        "objects": objects,
        "versions": class_versions(tree),
    }
    return json.dumps(document, separators=(",", ":")), tensors


class _Tensor(NamedTuple):
    dtype: str  # the restored dtype's name
    shape: tuple  # the restored shape (raw bytes have an extra axis)
    key_impl: str | None
    raw: bool  # stored as raw bytes (or key data): reinterpret what the source reads
    weak: bool | None  # weakly typed (None: a file without our metadata does not say)


def _sub_byte_bits(dtype: np.dtype) -> int:
    """How many bits of its byte an element of `dtype` uses (8 for most dtypes)."""
    if dtype == np.bool_:
        return 1
    if dtype.itemsize != 1:
        return 8
    for info in (ml_dtypes.iinfo, ml_dtypes.finfo):
        try:
            return int(info(dtype).bits)
        except (ValueError, TypeError):
            continue
    return 8


def _check_canonical(data: np.ndarray, name: str) -> None:
    """Refuse elements whose byte holds bits their dtype does not use (a bool stored as 2)."""
    bits = _sub_byte_bits(data.dtype)
    if bits >= 8 or data.size == 0:
        return
    raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    bad = np.flatnonzero(raw >> bits)
    if len(bad):
        allowed = "0 or 1" if bits == 1 else f"below {1 << bits}"
        raise ValueError(
            f"tensor {name!r} ({data.dtype.name}) holds the byte {int(raw[bad[0]])} at element "
            f"{int(bad[0])} ({len(bad)} bad in all); its bytes must be {allowed}"
        )


class SourceCatalog:
    """A `CheckpointSource` by name, with treeclass's document (if any) applied."""

    label = "the file"
    call = "tc.load(path, like)"

    def __init__(self, source: CheckpointSource) -> None:
        self.problems: list[str] = []
        self.source = source
        self.location = source.location
        self.title = f"The checkpoint {source.location}"
        document = self._document(source.metadata())
        self.records_values = document is not None
        document = document or {}
        # checkpoint versions by class name; None: written before versions were stamped
        self.class_versions = self._class_versions(document.get("versions"))
        raw = document.get("tensors", {})
        self.tensors = {name: self._tensor(name, raw.get(name)) for name in source.keys()}
        for name in raw:
            if name not in self.tensors:
                self._corrupt(
                    f"its treeclass metadata describes a tensor {name!r} it does not hold"
                )
        try:
            records = document.get("values", {})
            self.values = {name: _decode(record["value"]) for name, record in records.items()}
        except (KeyError, TypeError, ValueError) as error:
            self._corrupt(f"a value in its treeclass metadata is malformed ({error!r})")
        self.objects = {
            name: str(record.get("type")) for name, record in document.get("objects", {}).items()
        }
        seen = set(self.tensors)
        for name in [*self.values, *self.objects]:
            if name in seen:
                self._corrupt(f"the name {name!r} is given to two values")
            seen.add(name)

    def _corrupt(self, reason: str) -> NoReturn:
        corrupt(self.location, reason, self.source.format)

    def _document(self, metadata: Any) -> dict | None:
        text = metadata.get(METADATA_KEY)
        if text is None:
            return None  # written by another tool: tensors only
        try:
            document = strict_json(text)
        except ValueError as error:  # JSONDecodeError included
            self._corrupt(f"its treeclass metadata is not valid JSON ({error})")
        if not isinstance(document, dict) or document.get("format") != "treeclass":
            self._corrupt("its treeclass metadata is not a treeclass document")
        if document.get("version") != FORMAT_VERSION:
            raise ValueError(
                f"{self.location} was written by a treeclass with checkpoint format version "
                f"{document.get('version')}; this treeclass reads version {FORMAT_VERSION}. "
                "Upgrade treeclass."
            )
        for part in ("tensors", "values", "objects"):
            records = document.get(part, {})
            if not isinstance(records, dict) or not all(
                isinstance(r, dict) for r in records.values()
            ):
                self._corrupt(f"the {part!r} of its treeclass metadata are malformed")
        return document

    def _class_versions(self, stamps: Any) -> dict[str, int] | None:
        valid = isinstance(stamps, dict) and all(
            isinstance(stamp, dict)
            and type(stamp.get("version")) is int
            and stamp["version"] >= 0
            and isinstance(stamp.get("at"), list)
            and all(isinstance(at, str) for at in stamp["at"])
            for stamp in stamps.values()
        )
        if stamps is not None and not valid:
            self._corrupt(f"the class versions of its treeclass metadata are malformed: {stamps!r}")
        return stamps

    def _tensor(self, name: str, raw: dict | None) -> _Tensor:
        info = self.source.info(name)
        weak = (
            raw.get("weak", False) if raw is not None else (False if self.records_values else None)
        )
        if raw is not None and type(weak) is not bool:  # (`in (True, False)` takes 1 and 0)
            self._corrupt(f"the treeclass record of tensor {name!r} is malformed: {raw!r}")
        if raw is None or "dtype" not in raw:
            return _Tensor(info.dtype, info.shape, None, False, weak)
        # stored as raw bytes (or key data): the true dtype and shape are in the metadata
        try:
            true_dtype, true_shape, impl = str(raw["dtype"]), tuple(raw["shape"]), raw.get("impl")
            ok = all(type(n) is int and n >= 0 for n in true_shape)
            if impl is not None:  # PRNG keys: their uint32 key data, one more axis
                ok = ok and info.dtype == "uint32" and info.shape[:-1] == true_shape
                ok = ok and isinstance(impl, str)
            else:  # raw bytes: uint8, an axis of itemsize more
                base = numpy_dtype(true_dtype)
                itemsize = base.itemsize if base is not None else -1
                ok = ok and info.dtype == "uint8" and info.shape == (*true_shape, itemsize)
        except (KeyError, TypeError, ValueError):
            ok = False
        if not ok:
            self._corrupt(f"the treeclass record of tensor {name!r} is malformed: {raw!r}")
        if impl is not None:
            wrap = functools.partial(jax.random.wrap_key_data, impl=impl)
            try:
                made = str(jax.eval_shape(wrap, jax.ShapeDtypeStruct(info.shape, np.uint32)).dtype)
            except (ValueError, TypeError):
                self._corrupt(
                    f"tensor {name!r} holds PRNG keys of the implementation {impl!r} with key "
                    f"data of shape {list(info.shape)}, which this jax cannot make (an unknown "
                    "implementation, or keys of another size)"
                )
            if made != true_dtype:
                self._corrupt(
                    f"tensor {name!r} holds PRNG keys recorded as {true_dtype}, but keys of the "
                    f"implementation {impl!r} are {made}"
                )
        return _Tensor(true_dtype, true_shape, impl, True, weak)

    def names(self) -> Iterator[str]:
        yield from self.tensors
        yield from self.values
        yield from self.objects

    def stored(self, name: str) -> Stored | None:
        tensor = self.tensors.get(name)
        if tensor is not None:
            return Stored(TENSOR, tensor.dtype, tensor.shape, weak=tensor.weak)
        if name in self.values:
            return Stored(PLAIN, value=self.values[name])
        if name in self.objects:
            return Stored(OBJECT, value=self.objects[name])
        return None

    def range_reader(self, name: str) -> Callable[[int, int], np.ndarray] | None:
        """Byte ranges of tensor `name`; None where `fetch` does more than `read`."""
        tensor = self.tensors.get(name)
        if tensor is None or tensor.raw or tensor.key_impl:
            return None
        dtype = numpy_dtype(tensor.dtype)
        if dtype is None or dtype.hasobject or _sub_byte_bits(dtype) < 8:
            return None
        return functools.partial(self.source.read_range, name)

    def fetch(self, name: str) -> Any:
        tensor = self.tensors.get(name)
        if tensor is None:
            return self.values[name]
        data = self.source.read(name)
        if tensor.key_impl:
            # (jax takes a NumPy array here; its annotation says `Array`)
            return jax.random.wrap_key_data(data, impl=tensor.key_impl)  # type: ignore[arg-type]
        if tensor.raw:
            dtype = numpy_dtype(tensor.dtype)
            assert dtype is not None  # the records' dtypes were checked when the file was opened
            data = data.view(dtype.newbyteorder("<")).reshape(tensor.shape)
        try:
            _check_canonical(data, name)
        except ValueError as error:
            self._corrupt(str(error))
        return data
