"""Which registered reader opens a checkpoint (by `format=`, name ending, else first bytes;
a folder by the one checkpoint it holds), and which writer `tc.save` uses."""

from __future__ import annotations

import os
import re

from ..files._files import open_for_reading
from ..files._source import CheckpointSource, CheckpointWriter, Format, formats
from ._sharded import INDEX_SUFFIX, shard_names

_UNKNOWN_FORMAT = (
    "tc.load cannot tell the format of {path}: its name has none of the formats' "
    "extensions, and its first bytes ({head!r}) begin none of the formats it reads "
    "({formats}). If it is one of them, it is corrupted; else name the format:\n"
    "    tc.load(path, like, format='flax')"
)
_BAD_FORMAT = "tc.load's format= takes one of {formats} (or None: tell by the file); got {format!r}"
_READ_ONLY = (
    "its name ends like a checkpoint in the {format} format, which tc.load reads but tc.save does "
    "not write (a safetensors file under that name could not be loaded back). tc.save writes "
    "safetensors: one file, or a sharded checkpoint with max_shard_size=:\n"
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


def format_names() -> tuple[str, ...]:
    """The registered formats' names, as messages list them."""
    return tuple(row.name for row in formats())


def _by_name(name: object) -> Format | None:
    return next((row for row in formats() if row.name == name), None)


def _sniff(path: str) -> Format:
    for row in formats():  # the name says: its reader tells what is wrong, if anything
        if path.lower().endswith(row.suffixes):
            return row
    with open_for_reading(path) as file:
        head = file.read(16)
        size = os.fstat(file.fileno()).st_size
    for row in formats():
        if row.sniff(head, size):
            return row
    raise ValueError(_UNKNOWN_FORMAT.format(path=path, head=head[:8], formats=format_names()))


def open_source(path: str, like: object, format: str | None = None) -> CheckpointSource:
    """The checkpoint at `path` (a file, or a folder holding one) opened by its reader."""
    row = _by_name(format) if format is not None else None
    if format is not None and row is None:
        raise ValueError(_BAD_FORMAT.format(formats=format_names(), format=format))
    if os.path.isdir(path):
        path = _in_folder(path)
    return (row or _sniff(path)).open(path, like)


_BAD_SAVE_FORMAT = (
    "tc.save's format= takes one of {writes} (or None: tell by the name and max_shard_size); "
    "got {format!r}{why}"
)
_SHARDED_ONLY = (
    "format={format!r} {does}: give both or neither, "
    "tc.save(path, tree, format='sharded', max_shard_size='5GB')"
)


def writer_for(path: str, max_shard_size: object, format: str | None) -> CheckpointWriter:
    """The writer of `path` (refused for a name that could not be loaded back)."""
    if format is not None:
        given = _by_name(format)
        if given is None or given.save is None:
            why = f": {format} is a format tc.load reads only" if given is not None else ""
            writes = ", ".join(repr(r.name) for r in formats() if r.save is not None)
            raise ValueError(_BAD_SAVE_FORMAT.format(writes=writes, format=format, why=why))
        if (format == "sharded") != (max_shard_size is not None):
            does = "needs max_shard_size=" if format == "sharded" else "writes one file"
            raise ValueError(_SHARDED_ONLY.format(format=format, does=does))
    row = next((row for row in formats() if path.lower().endswith(row.suffixes)), None)
    if row is not None and row.save is None:
        single = os.path.splitext(path)[0] + ".safetensors"
        raise ValueError(_READ_ONLY.format(format=row.name, single=single))
    if row is not None and row.name == "sharded" and max_shard_size is None:
        single = path[: -len(INDEX_SUFFIX)]
        single += "" if single.lower().endswith(".safetensors") else ".safetensors"
        raise ValueError(_INDEX_WITHOUT_SHARDS.format(path=path, single=single))
    chosen = _by_name("safetensors" if max_shard_size is None else "sharded")
    assert chosen is not None and chosen.save is not None  # (both formats have a writer)
    return chosen.save(path, max_shard_size)
