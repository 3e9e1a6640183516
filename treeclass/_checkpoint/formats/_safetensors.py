"""The safetensors format (an 8-byte header length, a JSON header of each tensor's dtype,
shape and byte range, the bytes): a reader and a writer of our own, since the
`safetensors` package is no dependency, holds every tensor on the host to write, and
reads no bfloat16 or float8 into NumPy.
"""

from __future__ import annotations

import functools
import json
import math
import struct
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, BinaryIO, NamedTuple

import numpy as np

from ..files._files import file_reader, write_atomically
from ..files._json import MAX_HEADER_BYTES
from ..files._json import loads as strict_json
from ..files._source import FileSource, Format, OutTensor, TensorInfo, numpy_dtype, register_format

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

_DTYPES_OF_SAFETENSORS_NAMES = {
    code: dtype
    for name, code in _SAFETENSORS_NAMES.items()
    if (dtype := numpy_dtype(name)) is not None
}


def can_store(dtype: np.dtype) -> bool:
    """Whether the format has a name for `dtype` (else it is stored as raw bytes)."""
    return dtype.name in _SAFETENSORS_NAMES and numpy_dtype(dtype.name) == dtype


class _Tensor(NamedTuple):
    code: str  # the safetensors dtype name
    dtype: str  # its numpy name (the code itself for packed types)
    shape: tuple
    start: int
    stop: int


class SafetensorsFile(FileSource):
    """An opened safetensors file as a `CheckpointSource`; the header is checked here."""

    format = "safetensors"

    def __init__(self, file: BinaryIO, location: str) -> None:
        super().__init__(file, location)
        head = file.read(8)
        if len(head) < 8:
            self._corrupt(f"it has {self.size} bytes, fewer than a safetensors header needs")
        (length,) = struct.unpack("<Q", head)
        if length > self.size - 8:
            self._corrupt(f"its header claims {length} bytes, but the file has {self.size}")
        if length > MAX_HEADER_BYTES:
            self._corrupt(
                f"its header claims {length} bytes, more than the limit of {MAX_HEADER_BYTES}"
            )
        try:
            header = strict_json(file.read(length))
        except ValueError as error:  # UnicodeDecodeError and JSONDecodeError included
            self._corrupt(f"its header is not valid JSON ({error})")
        if not isinstance(header, dict):
            self._corrupt("its header is not a JSON object")
        self.data_start = 8 + length
        metadata = header.pop("__metadata__", None)
        if metadata is None:  # absent, or `null`: the reference reader takes both as none
            metadata = {}
        if not isinstance(metadata, dict):
            self._corrupt("its __metadata__ is not a JSON object")
        for key, value in metadata.items():
            if not isinstance(value, str):
                self._corrupt(
                    f"its __metadata__ maps {key!r} to a {type(value).__name__}: the format "
                    "allows only strings"
                )
        self._metadata = metadata
        self.tensors = {name: self._tensor(name, info) for name, info in header.items()}
        self._check_layout(self.size - self.data_start)

    def _tensor(self, name: str, info: Any) -> _Tensor:
        try:
            code, shape, (start, stop) = info["dtype"], info["shape"], info["data_offsets"]
            shape = tuple(shape)
            ok = all(type(n) is int and n >= 0 for n in (*shape, start, stop)) and start <= stop
        except (TypeError, KeyError, ValueError):
            ok, start, stop = False, 0, 0  # bound for type checkers: `_corrupt` raises below
        if not ok:
            self._corrupt(f"the header entry of tensor {name!r} is malformed: {info!r}")
        if code in _PACKED_SAFETENSORS_NAMES:
            return _Tensor(code, code, shape, start, stop)
        dtype = _DTYPES_OF_SAFETENSORS_NAMES.get(code)
        if dtype is None:
            self._corrupt(f"tensor {name!r} has the unknown dtype {code!r}")
        if stop - start != math.prod(shape) * dtype.itemsize:
            self._corrupt(
                f"tensor {name!r} is {code}{list(shape)}, which needs "
                f"{math.prod(shape) * dtype.itemsize} bytes, but its byte range holds "
                f"{stop - start}"
            )
        return _Tensor(code, dtype.name, shape, start, stop)

    def _check_layout(self, data_size: int) -> None:
        # the format's rule: the byte ranges tile the data section, without holes
        end = 0
        for name, tensor in sorted(self.tensors.items(), key=lambda kv: kv[1][3:5]):
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

    def keys(self) -> Iterator[str]:
        return iter(self.tensors)

    def info(self, key: str) -> TensorInfo:
        tensor = self.tensors[key]
        return TensorInfo(tensor.dtype, tensor.shape, tensor.stop - tensor.start)

    def metadata(self) -> Mapping[str, str]:
        return self._metadata

    def read_range(self, key: str, start: int, stop: int) -> np.ndarray:
        tensor = self.tensors[key]
        stop = min(stop, tensor.stop - tensor.start)
        return self.read_at(key, self.data_start + tensor.start + start, stop - start)

    def read(self, key: str) -> np.ndarray:
        tensor = self.tensors[key]
        buffer = self.read_range(key, 0, tensor.stop - tensor.start)
        dtype = numpy_dtype(tensor.dtype)
        if dtype is None:
            self._corrupt(f"tensor {key!r} has the dtype {tensor.code}, which NumPy cannot hold")
        return buffer.view(dtype.newbyteorder("<")).reshape(tensor.shape)


class SafetensorsSave:
    """The safetensors writer (a `CheckpointWriter`): one file, replaced atomically."""

    can_store = staticmethod(can_store)

    def __init__(self, path: str) -> None:
        self.path = path

    def prepare(
        self, metadata: Mapping[str, str], tensors: Sequence[OutTensor]
    ) -> Callable[[], None]:
        header = header_bytes(dict(metadata), tensors)
        return functools.partial(
            write_atomically, self.path, lambda put: write_tensors(put, header, tensors)
        )


def header_bytes(metadata: dict[str, str], tensors: Sequence[OutTensor]) -> bytes:
    """The length prefix and JSON header for `tensors` laid out in order."""
    header: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    for t in tensors:
        header[t.name] = {
            "dtype": _SAFETENSORS_NAMES[t.dtype.name],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + t.nbytes],
        }
        offset += t.nbytes
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as the format allows
    if len(text) > MAX_HEADER_BYTES:
        raise ValueError(
            f"its header would be {len(text)} bytes, more than safetensors readers accept "
            f"({MAX_HEADER_BYTES}): save fewer tensors or values per file"
        )
    return struct.pack("<Q", len(text)) + text


def write_tensors(
    put: Callable[[Any], object], header: bytes, tensors: Sequence[OutTensor]
) -> None:
    """Write a whole safetensors file by `put`, one tensor's bytes on the host at a time
    (each freed when its `put` returns)."""
    put(header)
    for tensor in tensors:
        put(tensor.whole().data)


def _is_safetensors(head: bytes, size: int) -> bool:
    """An 8-byte header length no longer than the file, then `{`."""
    return len(head) >= 9 and head[8:9] == b"{" and struct.unpack("<Q", head[:8])[0] <= size - 8


register_format(
    Format(
        "safetensors",
        (".safetensors",),
        _is_safetensors,
        file_reader(SafetensorsFile),
        lambda path, _: SafetensorsSave(path),
    )
)
