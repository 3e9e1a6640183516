"""equinox's `tree_serialise_leaves` files, read against a template (a `CheckpointSource`).

equinox writes a model's array and number leaves one after another, each as a `.npy`
record (`jnp.save`), with no names: a file is only its leaves in order. So the template
names them: the file's n-th record is the template's n-th array or number (leaf or
frozen value, what `tc.state_dict` holds), under its checkpoint name (`layers.0.weight`).
Key rules are then not needed; a file holding more or fewer records than the template
has leaves is an error naming the first path that has no partner, and one whose record
differs in shape or dtype is a mismatch at that path, as for any format.

We parse the records ourselves (`_npz.read_npy_header`); equinox is not imported.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, BinaryIO, NamedTuple

import numpy as np

from ..._values import array_type, path_str
from ..files._files import file_reader
from ..files._source import Format, WholeTensorCache, dtype_name, register_format
from ..names._walk import NUMBER, STATIC, TENSOR, entries
from ._npz import (
    NpyHeader,
    NpyRecords,
    npy_array,
    object_array_error,
    ranges_read_directly,
    read_exact,
    read_npy_header,
    refuses,
)

__all__ = ["Slot", "EquinoxFile"]


class Slot(NamedTuple):
    """One template leaf a record fills: its checkpoint name, key path, shape and dtype."""

    name: str
    where: str
    shape: tuple[int, ...]
    dtype: str | None  # None for a Python number (any dtype of its kind may hold it)


_COUNT = (
    "{location} holds {records} array(s), but the template has {slots} array and number "
    "leaves. An equinox file stores leaves by position alone, so the template must hold "
    "the saved model's leaves in the same order. {detail}"
)


class _Record(NamedTuple):
    header: NpyHeader
    start: int  # where its data starts in the file


class EquinoxFile(NpyRecords):
    """A `tree_serialise_leaves` file as a `CheckpointSource`, named by `slots`."""

    format = "equinox"

    def __init__(self, file: BinaryIO, location: str, slots: Sequence[Slot]) -> None:
        super().__init__(file, location)
        size = self.size
        records: list[_Record] = []
        at = 0
        while at < size:
            where = slots[len(records)].where if len(records) < len(slots) else "beyond"
            file.seek(at)
            try:
                header = read_npy_header(file)
            except ValueError as error:
                self._corrupt(f"record {len(records)} (for {where}): {error}")
            if refuses(header):
                raise object_array_error(location, where, header.dtype)
            start = at + header.size
            if start + header.nbytes > size:
                self._corrupt(
                    f"record {len(records)} (for {where}) is {header.dtype.name}"
                    f"{list(header.shape)}, {header.nbytes} bytes, but only {size - start} "
                    "follow its header: the file is truncated"
                )
            records.append(_Record(header, start))
            at = start + header.nbytes
        if len(records) != len(slots):
            raise ValueError(self._count_message(records, slots))
        self.records = {slot.name: record for slot, record in zip(slots, records)}
        self._whole = WholeTensorCache(self.read)

    def _count_message(self, records: list[_Record], slots: Sequence[Slot]) -> str:
        for slot, record in zip(slots, records):
            stored = record.header
            if stored.shape != slot.shape or slot.dtype not in (None, stored.dtype.name):
                template = array_type(slot.dtype or "number", slot.shape)
                detail = (
                    f"The first that differs is {slot.where}: {template} in the template, "
                    f"{array_type(stored.dtype.name, stored.shape)} in the file."
                )
                break
        else:
            if len(records) < len(slots):
                detail = f"The file has nothing for {slots[len(records)].where} and after."
            else:
                detail = f"The template ends at {slots[-1].where}." if slots else ""
        return _COUNT.format(
            location=self.location, records=len(records), slots=len(slots), detail=detail
        )

    # -- the CheckpointSource protocol ------------------------------------------------

    def _bytes(self, key: str, start: int, stop: int) -> np.ndarray:
        record = self.records[key]
        try:
            return read_exact(self.file, record.start + start, stop - start)
        except EOFError:
            self._corrupt(f"it ended inside the data of {key!r}")

    def read(self, key: str) -> np.ndarray:
        header = self.records[key].header
        return npy_array(self._bytes(key, 0, header.nbytes), header)

    def read_range(self, key: str, start: int, stop: int) -> np.ndarray:
        header = self.records[key].header
        stop = min(stop, header.nbytes)
        if ranges_read_directly(header):
            return self._bytes(key, start, stop)
        return self._whole(key, start, stop)


def _slots(like: Any) -> list[Slot]:
    """The template's leaves an equinox file holds, in order: arrays and numbers."""
    return [
        Slot(
            entry.name,
            path_str(like, entry.path),
            tuple(getattr(entry.value, "shape", ())),
            dtype_name(entry.value) if entry.category == TENSOR else None,
        )
        for entry in entries(like, "tc.load", "tc.load(path, value)")
        if entry.kind != STATIC and entry.category in (TENSOR, NUMBER)
    ]


def _open(path: str, like: object) -> EquinoxFile:
    return file_reader(lambda file, path: EquinoxFile(file, path, _slots(like)))(path, like)


register_format(Format("equinox", (".eqx",), lambda head, size: head[:6] == b"\x93NUMPY", _open))
