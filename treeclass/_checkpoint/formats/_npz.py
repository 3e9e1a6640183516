"""NumPy's `.npy` record and `.npz` archive (a zip of records), read without pickle (an
object array is refused, naming its key) through `numpy.lib.format`'s header parsers.
Opening an archive reads each member's header alone; data is read with the tensor.
"""

from __future__ import annotations

import math
import struct
import tokenize
import zipfile
import zlib
from collections.abc import Iterator, Mapping
from typing import IO, Any, BinaryIO, NamedTuple

import ml_dtypes
import numpy as np
from numpy.lib import format as npy_format

from ..files._files import file_reader, read_into
from ..files._source import FileSource, Format, TensorInfo, register_format

# numpy's own bound on a header it reads without `allow_pickle`-style trust
_MAX_NPY_HEADER = 10_000
# the most deflate expands its input (a run of one byte: 258 bytes per 2 bits, ~1032x)
_DEFLATE_RATIO = 1032
# a compressed record of another method is read in pieces of this size, not into a
# buffer of the size its header claims
_PIECE = 1 << 24

# what zipfile raises for an archive or member it cannot read: a bad CRC or stream, a
# version field, compression method or encryption it does not know
_ZIP_ERRORS = (
    zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, NotImplementedError, RuntimeError,
    EOFError,
)  # fmt: skip

_OBJECT_ARRAY = (
    "{location}: the array {key} holds Python objects (dtype {dtype}), which tc.load does "
    "not read: it would need pickle, and a file must not run code. Save it as a numeric "
    "array, or leave it out of the file."
)


def refuse_objects(header: NpyHeader, location: str, key: str) -> None:
    """Refuse a record of what tc.load never reads (objects, named fields) at `key`."""
    if header.dtype.hasobject or header.dtype.fields is not None:
        raise ValueError(_OBJECT_ARRAY.format(location=location, key=key, dtype=header.dtype))


class NpyHeader(NamedTuple):
    """A `.npy` record's header: the dtype as stored, its shape and memory order."""

    dtype: np.dtype  # as stored: byte order included; `V2` already read as bfloat16
    shape: tuple[int, ...]
    fortran_order: bool
    size: int  # the header's own length in bytes: the data starts there
    nbytes: int  # the data's length


def read_npy_header(file: IO[bytes]) -> NpyHeader:
    """The header of the `.npy` record (version 1 or 2) at `file`'s position."""
    start = file.tell()
    readers = {(1, 0): npy_format.read_array_header_1_0, (2, 0): npy_format.read_array_header_2_0}
    try:
        version = npy_format.read_magic(file)
        if version not in readers:
            raise ValueError(f"it is a .npy record of version {version}, not 1.0 or 2.0")
        shape, fortran_order, dtype = readers[version](file, max_header_size=_MAX_NPY_HEADER)
    except (ValueError, EOFError, SyntaxError, tokenize.TokenError) as error:
        # numpy's parser lets a header's tokenizer error out as it is (an unclosed bracket)
        raise ValueError(f"its .npy header is malformed ({error})") from None
    if dtype.kind == "V" and dtype.itemsize == 2 and dtype.fields is None:
        # NumPy has no bfloat16, so `jnp.save` writes it as 2-byte voids: read it as `jnp.load` does
        dtype = np.dtype(ml_dtypes.bfloat16)
    shape = tuple(shape)
    nbytes = math.prod(shape) * dtype.itemsize
    return NpyHeader(dtype, shape, bool(fortran_order), file.tell() - start, nbytes)


def npy_array(data: np.ndarray, header: NpyHeader) -> np.ndarray:
    """A record's data (flat `uint8`) as its array: C order, little-endian."""
    array = data.view(header.dtype)
    if header.fortran_order:
        array = np.ascontiguousarray(array.reshape(header.shape[::-1]).T)
    else:
        array = array.reshape(header.shape)
    if header.dtype.byteorder == ">":
        array = array.astype(header.dtype.newbyteorder("<"))
    return array


class NpyRecords(FileSource):
    """The `CheckpointSource` methods of a file of `.npy` records (`records`, by key)."""

    records: Mapping[str, Any]

    def keys(self) -> Iterator[str]:
        return iter(self.records)

    def info(self, key: str) -> TensorInfo:
        header = self.records[key].header
        return TensorInfo(header.dtype.name, header.shape, header.nbytes)


class _Member(NamedTuple):
    info: zipfile.ZipInfo
    header: NpyHeader
    data: int | None  # where a stored (uncompressed) record's data starts in the file


# a zip local file header: signature, then (at 26) the lengths of the name and the extra
_LOCAL_HEADER = struct.Struct("<4s22xHH")


class NpzFile(NpyRecords):
    """An opened `.npz` archive as a `CheckpointSource`, every member's header checked (a
    range is cut from its record read whole: a record's CRC-32 covers all of it)."""

    format = "npz"

    def __init__(self, file: BinaryIO, location: str) -> None:
        super().__init__(file, location)
        try:
            self.zip = zipfile.ZipFile(file)
        except (*_ZIP_ERRORS, ValueError) as error:
            self._corrupt(f"it is not a readable zip archive ({error})")
        self.records: dict[str, _Member] = {}
        for info in self.zip.infolist():
            if not info.filename.endswith(".npy"):
                self._corrupt(f"it holds {info.filename!r}, which is not a .npy record")
            key = info.filename[: -len(".npy")]
            if key in self.records:
                self._corrupt(f"it holds the record {info.filename!r} twice")
            if not 0 <= info.header_offset < self.size:
                self._corrupt(f"its directory places the record {key!r} outside the file")
            start = self._start(key, info)
            header = self._header(key, info, start)
            refuse_objects(header, location, repr(key))
            if info.file_size != header.size + header.nbytes:
                self._corrupt(
                    f"its header for {key!r} describes {header.nbytes} bytes of "
                    f"{header.dtype.name}{list(header.shape)}, but the record holds "
                    f"{info.file_size - header.size}"
                )
            data = None if start is None else start + header.size
            self.records[key] = _Member(info, header, data)

    def _start(self, key: str, info: zipfile.ZipInfo) -> int | None:
        """Where a stored member's bytes start (None for a compressed one), from its local
        header; refused if its sizes claim more than the file's bytes can hold."""
        stored = info.compress_type == zipfile.ZIP_STORED and not info.flag_bits & 1  # unencrypted
        start, end = 0, info.header_offset + info.compress_size
        if stored:
            self.file.seek(info.header_offset)
            local = self.file.read(_LOCAL_HEADER.size)
            if len(local) < _LOCAL_HEADER.size or local[:4] != b"PK\x03\x04":
                self._corrupt(f"the local header of the record {key!r} is missing")
            _, name, extra = _LOCAL_HEADER.unpack(local)
            start = info.header_offset + _LOCAL_HEADER.size + name + extra
            end = start + info.file_size
        if end > self.size:
            self._corrupt(f"the record {key!r} runs past the end of the file: it is truncated")
        deflated = info.compress_type == zipfile.ZIP_DEFLATED
        if deflated and info.file_size > _DEFLATE_RATIO * info.compress_size + 64:
            self._corrupt(
                f"the record {key!r} claims {info.file_size} bytes, more than its "
                f"{info.compress_size} compressed bytes can hold"
            )
        return start if stored else None

    def _header(self, key: str, info: zipfile.ZipInfo, start: int | None) -> NpyHeader:
        try:
            if start is not None:
                self.file.seek(start)
                return read_npy_header(self.file)
            with self.zip.open(info) as member:
                return read_npy_header(member)
        except ValueError as error:
            self._corrupt(f"the record {key!r}: {error}")
        except _ZIP_ERRORS as error:
            self._corrupt(f"the record {key!r} cannot be read ({error})")

    def _data(self, key: str) -> np.ndarray:
        member = self.records[key]
        if member.data is not None:  # a stored record: its bytes read in place, CRC-checked
            buffer = self.read_at(key, member.data, member.header.nbytes)
            self.file.seek(member.data - member.header.size)
            head = self.file.read(member.header.size)
            if zlib.crc32(buffer.data, zlib.crc32(head)) != member.info.CRC:
                self._corrupt(f"the data of {key!r} does not match its CRC-32: it is damaged")
            return buffer
        nbytes = member.header.nbytes
        # a deflated record is read in place (`_start` bounds its size); one of
        # unbounded expansion (bzip2, lzma: they raise OSError for bad data) piece by piece
        deflated = member.info.compress_type == zipfile.ZIP_DEFLATED
        errors = (*_ZIP_ERRORS, ValueError) + (() if deflated else (OSError,))
        buffer = np.empty(nbytes if deflated else 0, np.uint8)
        pieces: list[bytes] = []
        try:
            with self.zip.open(member.info) as stream:
                stream.seek(member.header.size)
                done = read_into(stream, buffer.data)  # type: ignore[arg-type]
                # reading to the end (a byte more) is where zipfile checks the CRC
                while done <= nbytes and (piece := stream.read(min(_PIECE, nbytes + 1 - done))):
                    pieces.append(piece)
                    done += len(piece)
        except errors as error:
            self._corrupt(f"the data of {key!r} cannot be read ({error})")
        if done < nbytes:
            self._corrupt(f"it ended inside the data of {key!r}")
        if done > nbytes:
            self._corrupt(f"the record {key!r} holds more bytes than its header says")
        return np.frombuffer(b"".join(pieces), np.uint8).copy() if pieces else buffer

    def read(self, key: str) -> np.ndarray:
        return npy_array(self._data(key), self.records[key].header)

    def close(self) -> None:
        try:
            self.zip.close()
        finally:
            self.file.close()


register_format(
    Format("npz", (".npz",), lambda head, size: head[:2] == b"PK", file_reader(NpzFile))
)
