"""The checkpoint source protocol: what a reader of one file format offers the loader.

A *source* is one opened checkpoint seen as named tensors plus string metadata, the
common ground of safetensors, npz, msgpack and the rest. It knows nothing of trees,
templates or treeclass's own metadata: the format-neutral loader (`_restore`) reads
those through it. A new format is one module with a class satisfying `CheckpointSource`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple, NoReturn, Protocol

import numpy as np

__all__ = ["TensorInfo", "CheckpointSource", "corrupt", "NOT_A_CHECKPOINT"]


class TensorInfo(NamedTuple):
    """One tensor as a source stores it (before treeclass's metadata reinterprets it).

    - `dtype`: the element type's NumPy name (`"float32"`, `"bfloat16"`, `"uint8"`), or
      the format's own name for a type NumPy cannot hold (`"F4"`): such a tensor can be
      listed and reported, never restored;
    - `shape`: its shape;
    - `nbytes`: the size of its data in the source.
    """

    dtype: str
    shape: tuple[int, ...]
    nbytes: int


class CheckpointSource(Protocol):
    """An opened checkpoint: tensor keys, their dtype and shape, metadata, their bytes.

    Every method raises `ValueError` naming `location` for a source that turns out to be
    corrupted; none raises anything else for bad bytes (`OSError` for I/O).
    """

    @property
    def location(self) -> str:
        """The file (or folder) this source reads, as messages name it."""
        ...

    @property
    def format(self) -> str:
        """The format's name, as messages say it (`"safetensors"`, `"npz"`)."""
        ...

    def keys(self) -> Iterable[str]:
        """The tensor keys, in the source's order."""
        ...

    def info(self, key: str) -> TensorInfo:
        """The dtype, shape and size of tensor `key` (`KeyError` if there is none)."""
        ...

    def metadata(self) -> Mapping[str, str]:
        """The source's string metadata (empty when the format has none)."""
        ...

    def read(self, key: str) -> np.ndarray:
        """Tensor `key` on the host: its stored dtype (little-endian) and shape."""
        ...

    def read_range(self, key: str, start: int, stop: int) -> np.ndarray:
        """Bytes `start:stop` of tensor `key`'s data as a flat `uint8` array."""
        ...

    def close(self) -> None:
        """Release the file."""
        ...


NOT_A_CHECKPOINT = (
    "{location} is not a checkpoint tc.load can read: {reason}. The file is corrupted or "
    "truncated (an interrupted copy?), or it is not a {format} file."
)


def corrupt(location: str, reason: str, format: str = "safetensors") -> NoReturn:
    """Raise the one error for a source that cannot be read: a `ValueError` naming it."""
    raise ValueError(NOT_A_CHECKPOINT.format(location=location, reason=reason, format=format))
