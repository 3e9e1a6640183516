"""What a checkpoint is to everything above, whatever its format: a source to read (named
tensors and string metadata), a writer to write, and the registry of formats."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, BinaryIO, NamedTuple, NoReturn, Protocol, runtime_checkable

import ml_dtypes  # a dependency of jax: the bfloat16, float8 and int4 numpy dtypes
import numpy as np

from ..._values import is_prng_key
from ._files import IO, read_into, reworded


class TensorInfo(NamedTuple):
    """One tensor as a source stores it (a dtype NumPy cannot hold by the format's name)."""

    dtype: str
    shape: tuple[int, ...]
    nbytes: int


class CheckpointSource(Protocol):
    """An opened checkpoint, whatever its format: `location`, the file (or folder) it reads,
    as messages name it; `format`, the format's name as messages say it (`"safetensors"`);
    `keys()`, the tensor keys in the source's order; `info(key)`, a tensor's dtype, shape and
    size (`KeyError` if there is none); `metadata()`, its string metadata (empty when the
    format has none); `read(key)`, a tensor on the host in its stored dtype (little-endian)
    and shape; `read_range(key, start, stop)`, bytes `start:stop` of what `read` returns,
    flat `uint8`, checked exactly as `read` checks them (cut from it where the file's bytes
    are not: `FileSource.read_range`); `close()`, the file released. Bad bytes raise only
    `ValueError` naming `location` (`OSError` for I/O)."""

    @property
    def location(self) -> str: ...
    @property
    def format(self) -> str: ...
    def keys(self) -> Iterable[str]: ...
    def info(self, key: str) -> TensorInfo: ...
    def metadata(self) -> Mapping[str, str]: ...
    def read(self, key: str) -> np.ndarray: ...
    def read_range(self, key: str, start: int, stop: int) -> np.ndarray: ...
    def close(self) -> None: ...


NOT_A_CHECKPOINT = (
    "{location} is not a checkpoint tc.load can read: {reason}. The file is corrupted or "
    "truncated (an interrupted copy?), or it is not a {format} file."
)


def corrupt(location: str, reason: str, format: str) -> NoReturn:
    """Raise the one error for a source that cannot be read: a `ValueError` naming it."""
    raise ValueError(NOT_A_CHECKPOINT.format(location=location, reason=reason, format=format))


class FileSource:
    """What the readers of an opened file share: its error, positioned reads, ranges cut
    from whole tensors, closing it."""

    format: str
    read: Callable[[str], np.ndarray]  # (each format's own)

    def __init__(self, file: BinaryIO, location: str) -> None:
        self.file, self.location = file, location
        self.size = os.fstat(file.fileno()).st_size  # (as the file was when opened)
        self._cut: tuple[str, np.ndarray] | None = None

    def read_range(self, key: str, start: int, stop: int) -> np.ndarray:
        """Bytes `start:stop` cut from tensor `key` read whole by `read`, with all its checks
        (the last tensor kept for the next range): for bytes in the file that are not `read`'s,
        or a checksum that covers the whole tensor."""
        if self._cut is None or self._cut[0] != key:
            self._cut = None  # free the previous tensor first
            self._cut = (key, np.ascontiguousarray(self.read(key)).reshape(-1).view(np.uint8))
        return self._cut[1][start:stop]

    def _corrupt(self, reason: str) -> NoReturn:
        corrupt(self.location, reason, self.format)

    def read_at(self, key: str, offset: int, count: int, out: Any = None) -> np.ndarray:
        """`count` bytes of tensor `key`'s data at `offset` (into `out`, else a new `uint8`
        array), read by `read_into` and counted."""
        out = np.empty(max(count, 0), np.uint8) if out is None else out
        view = memoryview(out).cast("B")
        try:
            done = read_into(self.file, view, offset)
        except OSError as error:  # a disk or network failure: the I/O error, naming the file
            message = f"reading tensor {key!r} of {self.location} failed ({error.strerror})"
            raise reworded(error, message, self.location) from error
        if done < len(view):
            self._corrupt(f"it ended inside the data of tensor {key!r}")
        IO.read(done)
        return out

    def metadata(self) -> Mapping[str, str]:
        return {}

    def close(self) -> None:
        self.file.close()


class OutTensor(NamedTuple):
    """A tensor to write: its name, stored dtype and shape, size, and how to get its bytes."""

    name: str
    dtype: np.dtype
    shape: tuple
    nbytes: int
    data: Callable[[], np.ndarray]  # the bytes, flat uint8, read when the tensor is written

    def whole(self) -> np.ndarray:
        """Its bytes (`data()`), refused if the tree changed under the save."""
        data = self.data()
        if data.nbytes != self.nbytes:
            raise ValueError(f"{self.name!r} changed size while being saved")
        return data


class PlannedTensor(NamedTuple):
    """One tensor of a save as planned: its name, the value, and how it is stored."""

    name: str
    value: Any  # what the writer reads: an array, a number, or a view of an array
    dtype: np.dtype  # as stored
    shape: tuple  # as stored
    nbytes: int
    record: dict  # the tensor's part of the treeclass metadata
    where: str  # its key path, for messages


@runtime_checkable
class SharedWrite(Protocol):
    """A save every process writes a share of, into files process 0 makes and places:
    `begin()`, on process 0, makes the files and returns what the others need to find them
    (JSON); `places(state)`, where each tensor's bytes go (a file's path, the offset in it);
    `finish(state)`, on process 0 once every process has written its share, puts the files
    in place; `abort(state)`, on process 0 when some process failed, removes them."""

    tensors: Sequence[OutTensor]

    def begin(self) -> dict[str, Any]: ...
    def places(self, state: dict[str, Any]) -> list[tuple[str, int]]: ...
    def finish(self, state: dict[str, Any]) -> None: ...
    def abort(self, state: dict[str, Any]) -> None: ...


class CheckpointWriter(Protocol):
    """How `tc.save` writes a format: the dtypes it names, and the checked write (`prepare`)."""

    def can_store(self, dtype: np.dtype) -> bool: ...
    def prepare(
        self, metadata: Mapping[str, str], tensors: Sequence[OutTensor]
    ) -> Callable[[], None] | SharedWrite: ...


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


def is_weak(value: object) -> bool:
    """Whether an array (or abstract array) is weakly typed, as `jnp.asarray(0.5)` is."""
    return bool(getattr(value, "weak_type", False))


class Format(NamedTuple):
    """One format: its name, name endings, a test of the first 16 bytes and size (a `loose`
    one tried last), its reader (path, template) and writer (path, shard limit)."""

    name: str
    suffixes: tuple[str, ...]
    sniff: Callable[[bytes, int], bool]
    open: Callable[[str, object], CheckpointSource]
    save: Callable[[str, object], CheckpointWriter] | None = None  # (path, max_shard_size)
    loose: bool = False


_REGISTERED: dict[str, Format] = {}
# the registry is filled at import (one row per format module), possibly from two threads
# importing at once: its writes are serialized, and a name is registered once
_REGISTERING = threading.Lock()


def register_format(row: Format) -> Format:
    """Add a format to those `tc.load` reads (and `tc.save` writes, with a writer)."""
    with _REGISTERING:
        if row.name in _REGISTERED:
            raise ValueError(f"a checkpoint format named {row.name!r} is registered already")
        claimed = {s: f.name for f in _REGISTERED.values() for s in f.suffixes}
        taken = [s for s in row.suffixes if s in claimed]
        if taken:
            raise ValueError(
                f"the format {row.name!r} claims {taken[0]!r}, which names the "
                f"{claimed[taken[0]]!r} format already"
            )
        _REGISTERED[row.name] = row
    return row


def formats() -> tuple[Format, ...]:
    """The registered formats: those `tc.save` writes, then the others, a loose test last."""
    rows = list(_REGISTERED.values())
    return tuple(sorted(rows, key=lambda r: (r.loose, r.save is None)))
