"""flax's `serialization.to_bytes` files: one msgpack document of nested maps, arrays as
extensions (1: ndarray, 3: NumPy scalar, a `(shape, dtype, bytes)` triple; 2: complex) or
chunked maps; opening reads only array headers, with `msgpack`, without flax."""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO, NamedTuple

import numpy as np

from ..files._files import file_reader
from ..files._json import MAX_DEPTH, MAX_HEADER_BYTES
from ..files._source import FileSource, Format, TensorInfo, numpy_dtype, register_format

_NEEDS_MSGPACK = (
    "Reading flax checkpoints needs the msgpack package, which is not installed:\n"
    "    pip install 'treeclass[msgpack]'   (or: pip install msgpack)"
)

_CHUNKED = "__msgpack_chunked_array__"
_NDARRAY, _COMPLEX, _SCALAR = 1, 2, 3  # flax's extension codes
# an array's (shape, dtype) header is a few hundred bytes at most
_ARRAY_HEADER_WINDOW = 4096
_READ_SIZE = 1024

# msgpack type bytes: the ranges of maps and arrays; extension headers as
# (header length, where the length field is, its struct format or the fixed length)
_MAPS = {*range(0x80, 0x90), 0xDE, 0xDF}
_ARRAYS = {*range(0x90, 0xA0), 0xDC, 0xDD}
_EXTENSIONS: dict[int, tuple[int, str | int]] = {
    0xD4: (2, 1), 0xD5: (2, 2), 0xD6: (2, 4), 0xD7: (2, 8), 0xD8: (2, 16),
    0xC7: (3, ">B"), 0xC8: (4, ">H"), 0xC9: (6, ">I"),
}  # fmt: skip
# bytes (bin, or raw str from writers before msgpack's bin type): (header length, format)
_BYTES: dict[int, tuple[int, str]] = {
    0xC4: (2, ">B"), 0xC5: (3, ">H"), 0xC6: (5, ">I"),
    0xD9: (2, ">B"), 0xDA: (3, ">H"), 0xDB: (5, ">I"),
}  # fmt: skip


class _Array(NamedTuple):
    dtype: np.dtype
    shape: tuple[int, ...]
    pieces: tuple[tuple[int, int], ...]  # (file offset, length) of its bytes, in order
    value: np.ndarray | None = None  # a number of the document, held here

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


class FlaxFile(FileSource):
    """An opened `to_bytes` file as a `CheckpointSource`; the document is checked here."""

    format = "flax msgpack"

    def __init__(self, file: BinaryIO, location: str) -> None:
        try:
            import msgpack
        except ImportError:
            raise ImportError(_NEEDS_MSGPACK) from None
        self.msgpack = msgpack
        super().__init__(file, location)
        self._restart(0)
        head = self._peek(1)
        if not head or head[0] not in _MAPS:
            self._corrupt("it does not start with a msgpack map, as flax's state dicts do")
        document = self._value((), 0)
        if self._position() != self.size:
            self._corrupt(f"{self.size - self._position()} bytes follow its msgpack document")
        self.arrays: dict[str, _Array] = {}
        self._name(document, ())

    def _restart(self, position: int) -> None:
        self.file.seek(position)
        self.base = position
        # small reads: the unpacker starts afresh after each array, and what it read ahead
        # of that array's header (1 MiB by default) would be read for nothing
        self.unpacker = self.msgpack.Unpacker(
            self.file, read_size=_READ_SIZE, raw=False, strict_map_key=False,
            **self._limits(min(self.size, MAX_HEADER_BYTES)),
        )  # fmt: skip

    @staticmethod
    def _limits(size: int) -> dict[str, int]:
        """msgpack's bounds for `size` bytes: no claimed length beyond what they can hold."""
        size = max(size, 1)
        return {
            "max_buffer_size": max(size, _READ_SIZE),
            "max_array_len": size,
            "max_map_len": max(size // 2, 1),
            "max_str_len": size,
            "max_bin_len": size,
            "max_ext_len": size,
        }

    def _position(self) -> int:
        return self.base + self.unpacker.tell()

    def _pread(self, position: int, count: int) -> bytes:
        here = self.file.tell()
        self.file.seek(position)
        data = self.file.read(count)
        self.file.seek(here)
        return data

    def _peek(self, count: int) -> bytes:
        return self._pread(self._position(), count)

    def _call(self, step: Callable[[], Any], path: tuple) -> Any:
        try:
            return step()
        except self.msgpack.OutOfData:
            self._corrupt(f"it ends inside {self._where(path)}: the file is truncated")
        except (ValueError, self.msgpack.UnpackException) as error:
            self._corrupt(f"{self._where(path)} is not valid msgpack ({error})")

    @staticmethod
    def _where(path: tuple) -> str:
        return f"the value at {'.'.join(path)!r}" if path else "the document"

    def _value(self, path: tuple, depth: int) -> Any:
        """The value at the current place: dicts of values, `_Array`s for extensions."""
        if depth > MAX_DEPTH:
            self._corrupt(f"it nests deeper than the limit of {MAX_DEPTH} levels")
        head = self._peek(6)
        if not head:
            self._corrupt(f"it ends before {self._where(path)}: the file is truncated")
        kind = head[0]
        if kind in _MAPS or kind in _ARRAYS:
            is_map = kind in _MAPS
            unpacker = self.unpacker
            read_header = unpacker.read_map_header if is_map else unpacker.read_array_header
            count = self._call(read_header, path)
            node: dict[str, Any] = {}
            for index in range(count):
                key = self._call(self.unpacker.unpack, path) if is_map else index
                if type(key) is int:
                    key = str(key)
                if type(key) is not str:
                    self._corrupt(f"a key of {self._where(path)} is a {type(key).__name__}")
                if key in node:
                    self._corrupt(f"the key {key!r} appears twice in {self._where(path)}")
                node[key] = self._value((*path, key), depth + 1)
            return node
        if kind in _EXTENSIONS:
            return self._extension(path, head)
        return self._call(self.unpacker.unpack, path)

    def _extension(self, path: tuple, head: bytes) -> Any:
        start = self._position()
        header, length = _EXTENSIONS[head[0]]
        if len(head) < header:
            self._corrupt(f"it ends inside {self._where(path)}: the file is truncated")
        if isinstance(length, str):
            (length,) = struct.unpack(length, head[1 : header - 1])
        code = struct.unpack("b", head[header - 1 : header])[0]
        data = start + header
        end = data + length
        if end > self.size:
            self._corrupt(f"it ends inside {self._where(path)}: the file is truncated")
        if code == _COMPLEX:
            value = self._call(self.unpacker.unpack, path)  # a few bytes: read it whole
            try:
                limits = self._limits(len(value.data))
                del limits["max_buffer_size"]  # (unpackb reads a buffer it is given whole)
                real, imag = self.msgpack.unpackb(value.data, **limits)
                return np.asarray(complex(real, imag))
            except (ValueError, TypeError, self.msgpack.UnpackException):
                self._corrupt(f"{self._where(path)} is a malformed complex number")
        if code not in (_NDARRAY, _SCALAR):
            self._corrupt(f"{self._where(path)} is a msgpack extension of unknown type {code}")
        array = self._array(path, data, length)
        self._restart(end)  # past the array's bytes, unread
        return array

    def _array(self, path: tuple, start: int, length: int) -> _Array:
        """The header of an ndarray extension at `start`: a msgpack `(shape, dtype, bytes)`."""
        where = f"the array at {'.'.join(path)!r}"
        window = self._pread(start, min(length, _ARRAY_HEADER_WINDOW))
        reader = self.msgpack.Unpacker(raw=False, **self._limits(len(window)))
        reader.feed(window)
        try:
            if reader.read_array_header() != 3:
                raise ValueError("not a (shape, dtype, bytes) triple")
            shape, dtype_name = reader.unpack(), reader.unpack()
            at = reader.tell()
        except (ValueError, self.msgpack.UnpackException) as error:
            self._corrupt(f"{where} has a malformed header ({error})")
        if isinstance(dtype_name, bytes):
            dtype_name = dtype_name.decode("ascii", "replace")
        ok = isinstance(shape, list) and all(type(n) is int and n >= 0 for n in shape)
        dtype = numpy_dtype(dtype_name) if isinstance(dtype_name, str) else None
        if not ok or len(shape) > MAX_DEPTH or dtype is None or dtype.hasobject:
            self._corrupt(f"{where} has a malformed header: shape {shape!r}, dtype {dtype_name!r}")
        kind = window[at] if at < len(window) else None
        if kind not in _BYTES:
            self._corrupt(f"{where} has no bytes after its header")
        header, form = _BYTES[kind]
        (count,) = struct.unpack(form, window[at + 1 : at + header])
        shape = tuple(shape)
        if at + header + count != length or count != math.prod(shape) * dtype.itemsize:
            self._corrupt(
                f"{where} is {dtype.name}{list(shape)}, which needs "
                f"{math.prod(shape) * dtype.itemsize} bytes, but it holds {count}"
            )
        return _Array(dtype, shape, ((start + at + header, count),))

    def _name(self, node: Any, path: tuple) -> None:
        name = ".".join(path)
        if isinstance(node, dict):
            if _CHUNKED in node:
                self._add(name, self._unchunk(node, name))
                return
            for key, child in node.items():
                self._name(child, (*path, key))
        elif isinstance(node, _Array):
            self._add(name, node)
        elif type(node) in (bool, int, float, np.ndarray):  # (an ndarray: a complex number)
            dtype = None
            if type(node) is int:  # msgpack holds no integer outside int64 and uint64
                dtype = np.int64 if -(2**63) <= node < 2**63 else np.uint64
            value = np.asarray(node, dtype)
            self._add(name, _Array(value.dtype, (), (), value))
        # strings, bytes and None are not data

    def _add(self, name: str, array: _Array) -> None:
        if name in self.arrays:
            self._corrupt(f"two values are named {name!r} (a key holds a dot)")
        self.arrays[name] = array

    def _unchunk(self, node: dict, name: str) -> _Array:
        shape, chunks = node.get("shape"), node.get("chunks")
        if not isinstance(shape, dict) or not isinstance(chunks, dict):
            self._corrupt(f"the chunked array {name!r} is malformed: no shape or chunks")
        try:
            dims = tuple(shape[str(i)] for i in range(len(shape)))
            pieces = [chunks[str(i)] for i in range(len(chunks))]
        except KeyError:
            self._corrupt(f"the chunked array {name!r} is malformed: its keys are not 0, 1, ...")
        arrays = [p for p in pieces if isinstance(p, _Array) and len(p.shape) == 1]
        dtypes = {array.dtype for array in arrays}
        if len(arrays) != len(pieces) or len(dtypes) != 1:
            self._corrupt(f"the chunked array {name!r} is malformed: a chunk is no flat array")
        dtype = dtypes.pop()
        spans = tuple(span for array in arrays for span in array.pieces)
        if (
            not all(type(n) is int and n >= 0 for n in dims)
            or sum(n for _, n in spans) != math.prod(dims) * dtype.itemsize
        ):
            self._corrupt(f"the chunked array {name!r} is malformed: its chunks miss its shape")
        return _Array(dtype, dims, spans)

    def keys(self) -> Iterator[str]:
        return iter(self.arrays)

    def info(self, key: str) -> TensorInfo:
        array = self.arrays[key]
        return TensorInfo(array.dtype.name, array.shape, array.nbytes)

    def read(self, key: str) -> np.ndarray:
        array = self.arrays[key]
        if array.value is not None:
            return array.value.copy()
        data = self._stored(key, 0, array.nbytes)
        # in the byte order its dtype name gives (`>f4`), as flax's `np.frombuffer` reads
        # it; little-endian, as every source returns tensors
        values = data.view(array.dtype).reshape(array.shape)
        if values.dtype.byteorder == ">":
            values = values.astype(array.dtype.newbyteorder("<"))
        return values

    def read_range(self, key: str, start: int, stop: int) -> np.ndarray:
        array = self.arrays[key]
        if array.value is not None or array.dtype.byteorder == ">":  # (not `read`'s bytes)
            return super().read_range(key, start, stop)
        return self._stored(key, start, stop)

    def _stored(self, key: str, start: int, stop: int) -> np.ndarray:
        array = self.arrays[key]
        stop = min(stop, array.nbytes)
        buffer = np.empty(max(stop - start, 0), np.uint8)
        at = 0  # where the current piece starts in the tensor's bytes
        for offset, count in array.pieces:  # the pieces of a chunked array, in order
            low, high = max(start, at), min(stop, at + count)
            if low < high:
                self.read_at(key, offset + low - at, high - low, buffer[low - start : high - start])
            at += count
        return buffer


def _is_msgpack_map(head: bytes, size: int) -> bool:
    """A msgpack map whose first key is a string (flax's keys are), or an empty map."""
    if not head or head[0] not in _MAPS:
        return False
    if head[0] == 0x80:
        return len(head) == 1
    key = head[{0xDE: 3, 0xDF: 5}.get(head[0], 1) :][:1]
    return bool(key) and (0xA0 <= key[0] <= 0xBF or key[0] in (0xD9, 0xDA, 0xDB))


# the loosest test of a file's first bytes: tried after every other format's
register_format(Format("flax", (".msgpack",), _is_msgpack_map, file_reader(FlaxFile), loose=True))
