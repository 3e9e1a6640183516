"""Sharded safetensors: an index (`{"metadata": {...}, "weight_map": {name: shard}}`) and
its shards beside it, read (index and shards agreeing exactly; `total_size` unchecked:
repositories disagree on it) and written (our saves tie them by a token)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from ..files._files import create_sized, discard, file_reader, open_for_reading, write_atomically
from ..files._json import MAX_HEADER_BYTES
from ..files._json import loads as strict_json
from ..files._source import FileSource, Format, OutTensor, SharedWrite, TensorInfo, register_format
from ..names._document import METADATA_KEY
from ._safetensors import SafetensorsFile, can_store, header_bytes

INDEX_SUFFIX = ".index.json"
# the metadata key of the token an index and its shards share (treeclass's saves only)
_SAVE_KEY = "treeclass.save"

_UNITS = {
    "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}  # fmt: skip
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([kmgt]?i?b)\s*$", re.IGNORECASE)
_BAD_SIZE = (
    "max_shard_size takes a positive number of bytes or a size such as '5GB' or '500MiB' "
    "(GB = 10**9 bytes, GiB = 2**30, as huggingface counts); got {value!r}"
)
_NOT_AN_INDEX = (
    "a sharded save writes an index and its shards, so its path names the index, ending in "
    "'{suffix}':\n"
    "    before: tc.save({path!r}, tree, max_shard_size=...)\n"
    "    after:  tc.save({fixed!r}, tree, max_shard_size=...)"
)


def parse_size(value: Any) -> int:
    """A size in bytes from an int or a string such as `"5GB"`; `ValueError` otherwise."""
    if type(value) is int and value > 0:
        return value
    match = _SIZE.match(value) if isinstance(value, str) else None
    size = int(float(match.group(1)) * _UNITS[match.group(2).lower()]) if match else 0
    if size <= 0:
        raise ValueError(_BAD_SIZE.format(value=value))
    return size


_open_shard = file_reader(SafetensorsFile)


def _plain_name(name: Any) -> bool:
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and not {"/", "\\", "\0"} & set(name)
        and os.path.basename(name) == name
        and not os.path.isabs(name)
    )


class ShardedSafetensors(FileSource):
    """An index and its shards as one `CheckpointSource`."""

    format = "sharded safetensors index"

    def __init__(self, location: str, like: object = None) -> None:  # (a format's opener)
        self.location = location
        self.shards: dict[str, SafetensorsFile] = {}
        try:
            self._open(location)
        except BaseException:
            self.close()
            raise

    def _open(self, location: str) -> None:
        with open_for_reading(location) as file:
            text = file.read(MAX_HEADER_BYTES + 1)
        try:
            index = strict_json(text)
        except ValueError as error:  # UnicodeDecodeError and JSONDecodeError included
            self._corrupt(f"it is not valid JSON ({error})")
        if not isinstance(index, dict) or not isinstance(index.get("weight_map"), dict):
            self._corrupt('it is not a JSON object with a "weight_map" object')
        metadata = index.get("metadata")
        metadata = {} if metadata is None else metadata  # `null`, as some writers put it
        if not isinstance(metadata, dict):
            self._corrupt('its "metadata" is not a JSON object')
        self._metadata = {k: v for k, v in metadata.items() if isinstance(v, str)}
        self.weight_map: dict[str, str] = index["weight_map"]
        folder = os.path.dirname(location)
        for name, shard in self.weight_map.items():
            if not _plain_name(shard):
                self._corrupt(
                    f"it maps {name!r} to {shard!r}, which is not the name of a file beside it "
                    "(a plain file name: no folder, no NUL byte)"
                )
            if shard not in self.shards:
                try:
                    self.shards[shard] = _open_shard(os.path.join(folder, shard), None)
                except FileNotFoundError:
                    self._corrupt(f"its shard {shard!r} does not exist (an incomplete download?)")
            if name not in self.shards[shard].tensors:
                self._corrupt(f"it maps {name!r} to the shard {shard!r}, which does not hold it")
        for shard, source in self.shards.items():
            for name in source.tensors:
                if self.weight_map.get(name) != shard:
                    self._corrupt(f"the shard {shard!r} holds {name!r}, which it maps elsewhere")
        token = self._metadata.get(_SAVE_KEY)
        for shard, source in self.shards.items():
            if token is not None and source.metadata().get(_SAVE_KEY) != token:
                self._corrupt(
                    f"the shard {shard!r} was written by another save than the index (an "
                    "interrupted tc.save over an older checkpoint?)"
                )

    def keys(self) -> Iterator[str]:
        return iter(self.weight_map)

    def info(self, key: str) -> TensorInfo:
        return self.shards[self.weight_map[key]].info(key)

    def metadata(self) -> Mapping[str, str]:
        return self._metadata

    def read(self, key: str) -> np.ndarray:
        return self.shards[self.weight_map[key]].read(key)

    def read_range(self, key: str, start: int, stop: int) -> np.ndarray:
        return self.shards[self.weight_map[key]].read_range(key, start, stop)

    def close(self) -> None:
        shards, self.shards = list(self.shards.values()), {}
        with contextlib.ExitStack() as closing:  # every shard closed, whichever fails
            for shard in shards:
                closing.callback(shard.close)


def _groups(tensors: Sequence[OutTensor], limit: int) -> list[list[OutTensor]]:
    groups: list[list[OutTensor]] = []
    size = 0
    for tensor in tensors:
        if not groups or size + tensor.nbytes > limit:
            groups.append([])
            size = 0
        groups[-1].append(tensor)
        size += tensor.nbytes
    return groups


def shard_names(index: str) -> list | None:
    """The shards the index at `index` names (its weight map's values, as they are), or None
    if it cannot be read."""
    try:
        with open_for_reading(index) as file:
            return list(strict_json(file.read(MAX_HEADER_BYTES + 1))["weight_map"].values())
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


class ShardedSave:
    """Where and how a sharded save writes: the index path and the shard limit, checked."""

    def __init__(self, path: str, max_shard_size: Any) -> None:
        self.limit = parse_size(max_shard_size)
        if not path.endswith(INDEX_SUFFIX):
            fixed = path.removesuffix(".safetensors") + ".safetensors" + INDEX_SUFFIX
            raise ValueError(_NOT_AN_INDEX.format(suffix=INDEX_SUFFIX, path=path, fixed=fixed))
        self.path = path
        self.base = os.path.basename(path).removesuffix(INDEX_SUFFIX).removesuffix(".safetensors")

    can_store = staticmethod(can_store)  # a `CheckpointWriter`: its shards are safetensors

    def prepare(self, metadata: Mapping[str, str], tensors: Sequence[OutTensor]) -> SharedWrite:
        """The save of `tensors` and an index holding `metadata`, as a `SharedWrite`."""
        header_bytes(dict(metadata), tensors)  # what one file could not hold, no shard can
        return _ShardedWrite(self, metadata, tensors)


class _ShardedWrite(SharedWrite):
    """The shards as temporary files made by process 0, renamed into place, the index last."""

    def __init__(
        self, save: ShardedSave, metadata: Mapping[str, str], tensors: Sequence[OutTensor]
    ) -> None:
        self.save, self.metadata, self.tensors = save, metadata, list(tensors)
        # the user's metadata (`{"format": "pt"}`) in every shard's header too, where
        # other readers look for it; treeclass's document stays in the index alone
        self.shard_metadata = {k: v for k, v in metadata.items() if k != METADATA_KEY}
        self.groups = _groups(self.tensors, save.limit)
        count = len(self.groups)
        self.names = [
            f"{save.base}-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)
        ]
        self.folder = os.path.dirname(save.path)

    def begin(self) -> dict[str, Any]:
        # the safetensors files the index there names now (an index from elsewhere may
        # name anything, itself included)
        names = shard_names(self.save.path) or []
        odd = any(isinstance(name, (list, dict)) for name in names)
        self.previous = {
            n for n in names if not odd and _plain_name(n) and n.endswith(".safetensors")
        }
        # treeclass's own layout ties its index and shards by a token of the save (so an
        # interrupted save over an older one is caught); an export in another library's
        # layout (no document) is that library's folder, metadata and all, byte for byte
        tokened = METADATA_KEY in self.metadata
        self.token = {_SAVE_KEY: secrets.token_hex(8)} if tokened else {}
        files: list[list[Any]] = []
        try:
            for name, group in zip(self.names, self.groups, strict=True):
                header = header_bytes({**self.shard_metadata, **self.token}, group)
                size = len(header) + sum(t.nbytes for t in group)
                files.append(
                    [create_sized(os.path.join(self.folder, name), size, header), len(header)]
                )
        except BaseException:
            self.abort({"files": files})
            raise
        return {"files": files}

    def places(self, state: dict[str, Any]) -> list[tuple[str, int]]:
        out = []
        for (temp, start), group in zip(state["files"], self.groups, strict=True):
            for tensor in group:
                out.append((temp, start))
                start += tensor.nbytes
        return out

    def finish(self, state: dict[str, Any]) -> None:
        for (temp, _), name in zip(state["files"], self.names, strict=True):
            target = os.path.join(self.folder, name)
            os.replace(temp, os.path.realpath(target) if os.path.islink(target) else target)
        index = {
            "metadata": {
                "total_size": sum(t.nbytes for t in self.tensors),
                **self.metadata,
                **self.token,
            },
            "weight_map": {
                t.name: name for name, group in zip(self.names, self.groups) for t in group
            },
        }
        text = json.dumps(index, indent=2).encode("utf-8")
        write_atomically(self.save.path, lambda put: put(text))
        for name in self.previous - set(self.names):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.folder, name))

    def abort(self, state: dict[str, Any]) -> None:
        for temp, _ in state["files"]:
            discard(temp)


# an index is told by its name alone (its JSON could be anything's)
register_format(
    Format("sharded", (INDEX_SUFFIX,), lambda head, size: False, ShardedSafetensors, ShardedSave)
)
