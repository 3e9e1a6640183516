"""equinox's `tree_serialise_leaves` files: `.npy` records of the array and number leaves
in order, named by the template (the n-th record fills its n-th array or number)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import BinaryIO, NamedTuple

import numpy as np

from ..._values import array_type, path_str
from ..files._files import file_reader
from ..files._source import Format, dtype_name, register_format
from ..names._walk import NUMBER, STATIC, TENSOR, entries
from ._npz import NpyHeader, NpyRecords, npy_array, read_npy_header, refuse_objects


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
            refuse_objects(header, location, where)
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

    def read(self, key: str) -> np.ndarray:
        record = self.records[key]
        return npy_array(self.read_at(key, record.start, record.header.nbytes), record.header)

    def read_range(self, key: str, start: int, stop: int) -> np.ndarray:
        record = self.records[key]
        stop = min(stop, record.header.nbytes)
        if not record.header.fortran_order and record.header.dtype.byteorder != ">":
            return self.read_at(key, record.start + start, stop - start)
        return super().read_range(key, start, stop)


def _open(path: str, like: object) -> EquinoxFile:
    slots = [  # the template's leaves an equinox file holds, in order: arrays and numbers
        Slot(
            entry.name,
            path_str(like, entry.path),
            tuple(getattr(entry.value, "shape", ())),
            dtype_name(entry.value) if entry.category == TENSOR else None,
        )
        for entry in entries(like, "tc.load", "tc.load(path, value)")
        if entry.kind != STATIC and entry.category in (TENSOR, NUMBER)
    ]
    return file_reader(lambda file, path: EquinoxFile(file, path, slots))(path, like)


register_format(Format("equinox", (".eqx",), lambda head, size: head[:6] == b"\x93NUMPY", _open))
