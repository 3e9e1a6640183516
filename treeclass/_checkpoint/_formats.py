"""Which reader opens a checkpoint: by `format=`, else by the file's contents or name.

| format | recognised by |
|---|---|
| `"safetensors"` | an 8-byte header length, then `{` |
| `"sharded"` | a name ending in `.index.json`, or a folder holding one such index (¹) |
| `"npz"` | a zip archive (`PK`) |
| `"flax"` | a msgpack map (flax's `serialization.to_bytes`) |
| `"equinox"` | a `.npy` record (`\\x93NUMPY`: equinox's `tree_serialise_leaves`) |

A name with one of the formats' extensions (`.safetensors`, `.npz`, `.msgpack`, `.eqx`)
goes to that format's reader, which says what is wrong with the file, if anything; any
other name (`checkpoint_100`, `model.bin`) is told by its first bytes, and one whose
bytes fit no format is an error listing the formats.

(¹) A folder's indexes of other libraries' shards (`pytorch_model.bin.index.json`,
`flax_model.msgpack.index.json`, `tf_model.h5.index.json`), which model repositories keep
beside their safetensors files, are passed over.
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Callable
from typing import Any, BinaryIO, NamedTuple

from .._values import path_str
from ._equinox import EquinoxFile, Slot
from ._files import open_for_reading
from ._flax import FlaxFile
from ._npz import NpzFile
from ._safetensors import SafetensorsFile, SafetensorsSave
from ._sharded import INDEX_SUFFIX, ShardedSafetensors, ShardedSave, shard_names
from ._source import CheckpointSource, CheckpointWriter, dtype_name
from ._walk import NUMBER, STATIC, TENSOR, entries

__all__ = ["Format", "TABLE", "FORMATS", "open_source", "writer_for"]

_UNKNOWN_FORMAT = (
    "tc.load cannot tell the format of {path}: its name has none of the formats' "
    "extensions, and its first bytes ({head!r}) begin none of the formats it reads "
    "({formats}). If it is one of them, it is corrupted; else name the format:\n"
    "    tc.load(path, like, format='flax')"
)
_BAD_FORMAT = "tc.load's format= takes one of {formats} (or None: tell by the file); got {format!r}"
_READ_ONLY = (
    "its name ends like a checkpoint in the {format} format, which tc.load reads but "
    "tc.save does not write (a safetensors file under that name could "
    "not be loaded back). tc.save writes safetensors: one file, or a sharded checkpoint "
    "with max_shard_size=:\n"
    "    tc.save({single!r}, tree)"
)
_INDEX_WITHOUT_SHARDS = (
    "its name is a sharded checkpoint's index, and a sharded "
    "save needs the largest shard's size. Give it, or save one file:\n"
    "    tc.save({path!r}, tree, max_shard_size='5GB')\n"
    "    tc.save({single!r}, tree)"
)
_FOLDER = (
    "{path} is a folder: tc.load reads a folder holding one sharded checkpoint (one "
    "'*{suffix}' file) or one '.safetensors' file, and this one holds {found}. Give the "
    "path of the file to load."
)


# indexes of other libraries' shards, which model repositories keep beside safetensors ones
# (`pytorch_model.bin.index.json`, `flax_model.msgpack.index.json`, `tf_model.h5.index.json`)
_FOREIGN_INDEXES = tuple(
    f"{ext}{INDEX_SUFFIX}" for ext in (".bin", ".pt", ".pth", ".msgpack", ".h5")
)


_SHARD_NAME = re.compile(r"-\d+-of-\d+\.safetensors$")
_BOTH = (
    "{path} holds both the sharded checkpoint {index} and the single file {single}: "
    "tc.load cannot tell which one is meant (transformers would take {single}). Give the "
    "path of the one to load: tc.load({first!r}, like)"
)


def _in_folder(path: str) -> str:
    names = sorted(n for n in os.listdir(path) if not n.endswith(_FOREIGN_INDEXES))
    found: list[str] = []
    for suffix in (".safetensors" + INDEX_SUFFIX, INDEX_SUFFIX):
        found = [n for n in names if n.endswith(suffix)]
        if found:
            break
    if len(found) == 1:  # one sharded checkpoint: no single file may sit beside it
        index = found[0]
        shards = shard_names(os.path.join(path, index))
        singles = [
            n
            for n in names
            if n.endswith(".safetensors")
            and (n not in shards if shards is not None else not _SHARD_NAME.search(n))
        ]
        if singles:
            single = os.path.join(path, singles[0])
            raise ValueError(_BOTH.format(path=path, index=index, single=singles[0], first=single))
        return os.path.join(path, index)
    if not found:
        found = [n for n in names if n.endswith(".safetensors")]
        if len(found) == 1:
            return os.path.join(path, found[0])
    shown = ", ".join(found[:5]) + (", ..." if len(found) > 5 else "") if found else "neither"
    raise ValueError(_FOLDER.format(path=path, suffix=INDEX_SUFFIX, found=shown))


def _is_msgpack_map(head: bytes) -> bool:
    """A msgpack map whose first key is a string (flax's keys are), or an empty map."""
    if not head or not (0x80 <= head[0] <= 0x8F or head[0] in (0xDE, 0xDF)):
        return False
    if head[0] == 0x80:
        return len(head) == 1
    key = head[{0xDE: 3, 0xDF: 5}.get(head[0], 1) :][:1]
    return bool(key) and (0xA0 <= key[0] <= 0xBF or key[0] in (0xD9, 0xDA, 0xDB))


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


def _with_file(path: str, make: Callable[[BinaryIO], CheckpointSource]) -> CheckpointSource:
    file = open_for_reading(path)
    try:
        return make(file)
    except BaseException:
        file.close()
        raise


def _is_safetensors(head: bytes, size: int) -> bool:
    """An 8-byte header length no longer than the file, then `{`."""
    return len(head) >= 9 and head[8:9] == b"{" and struct.unpack("<Q", head[:8])[0] <= size - 8


class Format(NamedTuple):
    """One format `tc.load` reads: its name for `format=`, the name endings that mean it,
    a test of a file's first 16 bytes (and size), and its reader (given the path and the
    template, which names the records of an equinox file)."""

    name: str
    suffixes: tuple[str, ...]
    sniff: Callable[[bytes, int], bool]
    open: Callable[[str, object], CheckpointSource]
    save: Callable[[str, object], CheckpointWriter] | None = None  # (path, max_shard_size)


def _reader(
    make: Callable[[BinaryIO, str], CheckpointSource],
) -> Callable[[str, object], CheckpointSource]:
    return lambda path, like: _with_file(path, lambda file: make(file, path))


def _sharded(path: str, like: object) -> CheckpointSource:
    return ShardedSafetensors(path)


def _equinox(path: str, like: object) -> CheckpointSource:
    return _with_file(path, lambda file: EquinoxFile(file, path, _slots(like)))


# in the order a file's first bytes are tried: a msgpack map's test is the loosest
TABLE = (
    Format(
        "safetensors",
        (".safetensors",),
        _is_safetensors,
        _reader(SafetensorsFile),
        lambda path, _: SafetensorsSave(path),
    ),
    Format("sharded", (INDEX_SUFFIX,), lambda head, size: False, _sharded, ShardedSave),
    Format("npz", (".npz",), lambda head, size: head[:2] == b"PK", _reader(NpzFile)),
    Format("equinox", (".eqx",), lambda head, size: head[:6] == b"\x93NUMPY", _equinox),
    Format("flax", (".msgpack",), lambda head, size: _is_msgpack_map(head), _reader(FlaxFile)),
)
_BY_NAME = {row.name: row for row in TABLE}
FORMATS = tuple(_BY_NAME)  # as messages list them


def _sniff(path: str) -> Format:
    for row in TABLE:  # the name says: its reader tells what is wrong, if anything
        if path.lower().endswith(row.suffixes):
            return row
    with open_for_reading(path) as file:
        head = file.read(16)
        size = os.fstat(file.fileno()).st_size
    for row in TABLE:
        if row.sniff(head, size):
            return row
    raise ValueError(_UNKNOWN_FORMAT.format(path=path, head=head[:8], formats=FORMATS))


def open_source(path: str, like: object, format: str | None = None) -> CheckpointSource:
    """The checkpoint at `path` (a file, or a folder holding one) opened by its reader.

    `like` is the template, which names the records of an equinox file.
    """
    if format is not None and format not in _BY_NAME:
        raise ValueError(_BAD_FORMAT.format(formats=FORMATS, format=format))
    if os.path.isdir(path):
        path = _in_folder(path)
    return (_BY_NAME[format] if format is not None else _sniff(path)).open(path, like)


_SAVE_FORMATS = ", ".join(repr(row.name) for row in TABLE if row.save is not None)
_BAD_SAVE_FORMAT = (
    "tc.save's format= takes one of {writes} (or None: tell by the name and max_shard_size); "
    "got {format!r}{why}"
)
_SHARDED_ONLY = (
    "format={format!r} {does}: give both or neither, "
    "tc.save(path, tree, format='sharded', max_shard_size='5GB')"
)


def writer_for(
    path: str, max_shard_size: object = None, format: str | None = None
) -> CheckpointWriter:
    """The writer `tc.save` writes `path` with: the `format` given (a format with a
    writer), else sharded safetensors with a shard limit, else one safetensors file. A
    name that ends like another format (or like a sharded index, without a shard limit)
    is refused: what it wrote could not be loaded back by that name."""
    if format is not None:
        row = _BY_NAME.get(format) if isinstance(format, str) else None
        if row is None or row.save is None:
            why = f": {format} is a format tc.load reads only" if row is not None else ""
            raise ValueError(_BAD_SAVE_FORMAT.format(writes=_SAVE_FORMATS, format=format, why=why))
        if (format == "sharded") != (max_shard_size is not None):
            does = "needs max_shard_size=" if format == "sharded" else "writes one file"
            raise ValueError(_SHARDED_ONLY.format(format=format, does=does))
    row = next((row for row in TABLE if path.lower().endswith(row.suffixes)), None)
    if row is not None and row.save is None:
        single = os.path.splitext(path)[0] + ".safetensors"
        raise ValueError(_READ_ONLY.format(format=row.name, single=single))
    if row is not None and row.name == "sharded" and max_shard_size is None:
        single = path[: -len(INDEX_SUFFIX)]
        single += "" if single.lower().endswith(".safetensors") else ".safetensors"
        raise ValueError(_INDEX_WITHOUT_SHARDS.format(path=path, single=single))
    save = _BY_NAME["safetensors" if max_shard_size is None else "sharded"].save
    assert save is not None  # (both formats have a writer)
    return save(path, max_shard_size)
