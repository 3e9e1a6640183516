"""Checkpoint files in a run of several JAX processes: who writes, who waits, what each reads.

**Saving.** Every process calls `tc.save` with the same path and a tree of the same
structure; process 0 alone writes the file, so two processes never race on one path. An
array process 0 holds whole (fully replicated, or split only over each process's own
devices) is read from process 0's own shards, without the others. Any other array is
split across processes, and is gathered while process 0 writes it
(`multihost_utils.process_allgather`, a collective): process 0 announces each such
tensor in turn through the distributed runtime's key-value store, and the other
processes join that gather, so the gathers happen in the order the writer reads the
tensors, whatever that order is. The others return once process 0 has written the file.

Every wait is bounded: a call on one process alone (`if jax.process_index() == 0:
tc.save(...)`), or calls with different paths or trees, raise a clear error on each
process that made one instead of waiting forever. The processes meet through numbered
arrivals in the key-value store: each other process posts its arrival `k`, process 0
claims it (an atomic increment, so a process that gives up and the writer never both
think they own it) and answers with the go-ahead, or with why not.

**Loading.** `place_by_slices` builds a sharded array from a callback that reads, for
each shard this process holds, only that shard's bytes (`read_block`): one read for a
slice of the leading axis, one per row for a slice of a later axis.

This module sits below `_tree` and `_document`: it imports neither.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from .._values import is_prng_key

__all__ = [
    "ARRIVAL_TIMEOUT_S",
    "STEP_TIMEOUT_S",
    "host_view",
    "save_from_processes",
    "read_block",
    "place_by_slices",
]

# How long process 0 waits for the others to call `tc.save` (and they for it). Processes
# reach a save at nearly the same time (their training steps wait on each other), so a
# long wait means a call made on some processes only.
ARRIVAL_TIMEOUT_S = 300.0
# How long a process waits for process 0's next step while it writes (one tensor).
STEP_TIMEOUT_S = 3600.0
_PREFIX = "treeclass/save"
# a slice read as rows of a later axis takes at most this many reads; past it, whole
# rows of that axis are read and trimmed in memory
_MAX_READS = 1 << 14

_NOT_EVERYWHERE = (
    "tc.save cannot write {path}: in a run of {count} processes every process must call "
    "tc.save(path, tree) with the same path; process 0 writes the file and the others "
    "take part (they gather the arrays split across processes) and wait for it. {who} "
    "did not call it within {timeout:.0f} s. Call it on every process, outside any "
    "`if jax.process_index() == 0:`."
)
_DIFFERENT_CALLS = (
    "tc.save cannot write {path}: in a run of several processes every process must call "
    "tc.save with the same path and a tree of the same structure (the same names, dtypes, "
    "shapes and shardings); {difference}"
)
_FAILED_ELSEWHERE = "tc.save on process 0 (the one that writes {path}) failed: {error}"
_GATHER_OUTSIDE_SAVE = (
    "the array at {where} is split across processes: only tc.save, called on every "
    "process, can gather it"
)


# --------------------------------------------------------------------------------------
# Saving: what this process can read of an array, and the meeting of the processes
# --------------------------------------------------------------------------------------


def _bounds(index: Any, shape: tuple) -> tuple[tuple[int, int], ...]:
    """A shard's index (a tuple of slices, one per axis) as `(start, stop)` per axis."""
    # (a PRNG key array's shards may index its key data's trailing axis too)
    index = tuple(index)[: len(shape)] + (slice(None),) * (len(shape) - len(index))
    return tuple(s.indices(n)[:2] for s, n in zip(index, shape, strict=True))


def _key_data(array: Any) -> Any:
    return jax.random.key_data(array) if is_prng_key(array) else array


class _LocalShards:
    """An array this process holds every part of, across its own devices: assembled here."""

    def __init__(self, array: jax.Array) -> None:
        self.array = array

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        shards: dict[tuple, Any] = {}
        for shard in self.array.addressable_shards:
            shards.setdefault(_bounds(shard.index, self.array.shape), shard.data)
        out = None
        for bounds, data in shards.items():
            block = np.asarray(_key_data(data))  # a single-device array: nothing collective
            if out is None:
                out = np.empty(self.array.shape + block.shape[self.array.ndim :], block.dtype)
            out[tuple(slice(a, b) for a, b in bounds)] = block
        assert out is not None  # an array has at least one shard
        return out if dtype is None else out.astype(dtype)


class _Gathered:
    """An array split across processes: gathered when the writer reads it, in a save."""

    def __init__(self, array: jax.Array, where: str) -> None:
        self.array, self.where = array, where
        self.announce: Callable[[], None] | None = None  # set by the save it is part of

    def gather(self) -> np.ndarray:
        # a collective: every process runs this, for the same tensors in the same order
        return np.asarray(multihost_utils.process_allgather(_key_data(self.array), tiled=True))

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        if self.announce is None:
            raise ValueError(_GATHER_OUTSIDE_SAVE.format(where=self.where))
        self.announce()
        out = self.gather()
        return out if dtype is None else out.astype(dtype)


def host_view(array: jax.Array, where: str) -> Any:
    """What a save reads for `array`, one not fully addressable here: `np.asarray` of it
    gives the array's values (a PRNG key array's key data).

    Nothing is read yet. A fully replicated array is this process's copy; one whose every
    part is on process 0's devices is assembled there from them; any other is gathered
    from all processes while the file is written (`save_from_processes`). Every process
    decides alike, from the sharding: they must agree on which arrays are gathered.
    """
    if array.is_fully_replicated:
        return array.addressable_data(0)
    indices = array.sharding.devices_indices_map(array.shape)
    held = {_bounds(i, array.shape) for d, i in indices.items() if d.process_index == 0}
    if sum(math.prod(b - a for a, b in bounds) for bounds in held) == array.size:
        return _LocalShards(array)  # (the shards of one array are equal or disjoint)
    return _Gathered(array, where)


# One save at a time per process, and what the meetings have used so far: the arrivals
# this process posted (`arrivals`), and on process 0 the next arrival of each other
# process (`seen`). The key-value store is shared by the whole run, so these counters
# must stay in step with it; the lock keeps two threads of one process from interleaving.
_lock = threading.Lock()
_counters: dict[str, Any] = {"saves": 0, "arrivals": 0, "seen": {}}


def _client() -> Any:
    # The distributed runtime's client: its key-value store gives waits a timeout, which
    # collectives (`multihost_utils.sync_global_devices`) do not. JAX has no public name
    # for it; orbax uses the same one.
    from jax._src import distributed

    client = distributed.global_state.client
    if client is None:
        raise RuntimeError("tc.save in a run of several processes needs jax.distributed.initialize")
    return client


def _get(client: Any, key: str, timeout_s: float) -> str | None:
    """The value of `key` once it is set, or None if it is not within `timeout_s`."""
    try:
        return client.blocking_key_value_get(key, max(1, int(timeout_s * 1000)))
    except jax.errors.JaxRuntimeError as error:
        if "DEADLINE_EXCEEDED" in str(error):
            return None
        raise


def _describe(path: str, tensors: Sequence[Any]) -> str:
    """What the processes must agree on: the path, and each tensor's name, stored dtype
    and shape, and whether it is gathered (by a digest: the header may be large)."""
    parts = [(t.name, str(t.dtype), list(t.shape), type(t.value).__name__) for t in tensors]
    digest = hashlib.sha256(json.dumps(parts).encode()).hexdigest()
    return json.dumps({"path": path, "tensors": digest, "count": len(parts)})


def _difference(mine: str, theirs: str, process: int) -> str | None:
    a, b = json.loads(mine), json.loads(theirs)
    if a == b:
        return None
    if a["path"] != b["path"]:
        return f"process 0 saves to {a['path']!r} but process {process} to {b['path']!r}"
    return (
        f"the trees of process 0 ({a['count']} tensors) and process {process} "
        f"({b['count']} tensors) differ"
    )


def _raise_remote(kind: str, message: str) -> None:
    if kind == "ValueError":
        raise ValueError(message)
    if kind == "TimeoutError":
        raise TimeoutError(message)
    if kind == "OSError":
        raise OSError(message)
    raise RuntimeError(message)


def save_from_processes(path: str, tensors: Sequence[Any], write: Callable[[], None]) -> None:
    """Run `write` (which writes the file at `path` and reads every tensor's value) on
    process 0, with every other process taking part in the gathers of `tensors`.

    `tensors` are the save's planned tensors (`.name`, `.dtype`, `.shape`, `.value`), the
    same on every process. In a run of one process this is `write()`.
    """
    if jax.process_count() == 1:
        write()
        return
    with _lock:
        if jax.process_index() == 0:
            _write_as_process_0(path, tensors, write)
        else:
            _take_part(path, tensors)


def _write_as_process_0(path: str, tensors: Sequence[Any], write: Callable[[], None]) -> None:
    client, count = _client(), jax.process_count()
    save = _counters["saves"]
    _counters["saves"] += 1
    seen: dict[int, int] = _counters["seen"]
    mine = _describe(path, tensors)
    deadline = time.monotonic() + ARRIVAL_TIMEOUT_S
    arrived: dict[int, tuple[int, str]] = {}
    for process in range(1, count):
        while process not in arrived:
            k = seen.get(process, 0)
            theirs = _get(client, f"{_PREFIX}/arrive/{process}/{k}", deadline - time.monotonic())
            if theirs is None:
                break
            seen[process] = k + 1
            if client.key_value_increment(f"{_PREFIX}/claim/{process}/{k}", 1) == 1:
                arrived[process] = (k, theirs)
            # else: that process gave up on this arrival before we claimed it: its next
    missing = [p for p in range(1, count) if p not in arrived]
    error: tuple[str, str] | None = None
    if missing:
        who = f"process {missing[0]}" if len(missing) == 1 else f"processes {missing}"
        text = _NOT_EVERYWHERE.format(path=path, count=count, who=who, timeout=ARRIVAL_TIMEOUT_S)
        error = ("TimeoutError", text)
    else:
        for process, (_, theirs) in arrived.items():
            difference = _difference(mine, theirs, process)
            if difference is not None:
                error = ("ValueError", _DIFFERENT_CALLS.format(path=path, difference=difference))
                break
    for process, (k, _) in arrived.items():
        answer = {"save": save} if error is None else {"error": error}
        client.key_value_set(f"{_PREFIX}/reply/{process}/{k}", json.dumps(answer))
    if error is not None:
        _raise_remote(*error)
    if save > 0:  # every process has finished the previous save: its steps can go
        client.key_value_delete(f"{_PREFIX}/{save - 1}")
    steps = itertools.count()
    order = {id(t.value): i for i, t in enumerate(tensors)}

    def announcer(value: Any) -> Callable[[], None]:
        def announce() -> None:
            step = f"{_PREFIX}/{save}/step/{next(steps)}"
            client.key_value_set(step, json.dumps({"gather": order[id(value)]}))

        return announce

    gathered = [t.value for t in tensors if isinstance(t.value, _Gathered)]
    for value in gathered:
        value.announce = announcer(value)
    outcome: dict[str, Any] = {"done": True}
    try:
        write()
    except BaseException as failure:
        kind = "OSError" if isinstance(failure, OSError) else type(failure).__name__
        outcome = {"error": [kind, _FAILED_ELSEWHERE.format(path=path, error=failure)]}
        raise
    finally:
        for value in gathered:
            value.announce = None
        client.key_value_set(f"{_PREFIX}/{save}/step/{next(steps)}", json.dumps(outcome))


def _take_part(path: str, tensors: Sequence[Any]) -> None:
    client, process = _client(), jax.process_index()
    k = _counters["arrivals"]
    _counters["arrivals"] += 1
    client.key_value_set(f"{_PREFIX}/arrive/{process}/{k}", _describe(path, tensors))
    # process 0 may arrive up to a timeout after us, then wait as long for the others
    reply = _get(client, f"{_PREFIX}/reply/{process}/{k}", 2 * ARRIVAL_TIMEOUT_S)
    if reply is None:
        if client.key_value_increment(f"{_PREFIX}/claim/{process}/{k}", 1) == 1:
            text = _NOT_EVERYWHERE.format(
                path=path, count=jax.process_count(), who="process 0",
                timeout=2 * ARRIVAL_TIMEOUT_S,
            )  # fmt: skip
            raise TimeoutError(text)
        # process 0 claimed our arrival just now: its answer is on its way
        reply = _get(client, f"{_PREFIX}/reply/{process}/{k}", ARRIVAL_TIMEOUT_S)
        if reply is None:
            raise TimeoutError(f"tc.save cannot write {path}: process 0 stopped answering")
    answer = json.loads(reply)
    for key in ("arrive", "reply", "claim"):
        client.key_value_delete(f"{_PREFIX}/{key}/{process}/{k}")
    if "error" in answer:
        _raise_remote(*answer["error"])
    save = answer["save"]
    for step in itertools.count():
        posted = _get(client, f"{_PREFIX}/{save}/step/{step}", STEP_TIMEOUT_S)
        if posted is None:
            raise TimeoutError(
                f"tc.save cannot write {path}: process 0 did not go on writing within "
                f"{STEP_TIMEOUT_S:.0f} s"
            )
        message = json.loads(posted)
        if "gather" in message:
            tensors[message["gather"]].value.gather()  # the result is process 0's to write
        elif "error" in message:
            _raise_remote(*message["error"])
        else:
            return


# --------------------------------------------------------------------------------------
# Loading: each process reads the bytes of its own shards
# --------------------------------------------------------------------------------------


def read_block(
    bounds: tuple[tuple[int, int], ...],
    shape: tuple[int, ...],
    itemsize: int,
    read_range: Callable[[int, int], np.ndarray],
) -> np.ndarray:
    """The bytes of the block `bounds` (`(start, stop)` per axis) of a C-ordered tensor of
    `shape`, as a `uint8` array of the block's shape plus an axis of `itemsize` bytes.

    `read_range(start, stop)` reads a byte range of the tensor. A block of whole rows of
    the leading axis is one read; a block cut along later axes is one read per row of the
    axes before the last one cut (bounded by `_MAX_READS`: past that, the last cut axes are
    read whole and the block trimmed in memory).
    """
    full = tuple((0, n) for n in shape)
    cut = [axis for axis in range(len(shape)) if bounds[axis] != full[axis]]
    last = cut[-1] if cut else -1
    while last > 0 and math.prod(b - a for a, b in bounds[:last]) > _MAX_READS:
        last -= 1  # fewer, longer reads: this axis read whole, trimmed below
    read = bounds[: last + 1] + full[last + 1 :]
    extent = tuple(b - a for a, b in read)
    strides = [itemsize * math.prod(shape[axis + 1 :]) for axis in range(len(shape))]
    size = itemsize * math.prod(extent)
    if last < 0:
        out = read_range(0, size)
    else:
        chunk = extent[last] * strides[last]
        out = np.empty(size, np.uint8)
        starts = itertools.product(*(range(a, b) for a, b in read[:last]))
        for n, rows in enumerate(starts):
            offset = sum(i * s for i, s in zip(rows, strides)) + read[last][0] * strides[last]
            out[n * chunk : (n + 1) * chunk] = read_range(offset, offset + chunk)
    block = out.reshape(*extent, itemsize)
    trim = tuple(slice(a - r, b - r) for (a, b), (r, _) in zip(bounds, read, strict=True))
    return block[trim]


def place_by_slices(
    shape: tuple[int, ...],
    dtype: np.dtype,
    sharding: jax.sharding.Sharding,
    read_range: Callable[[int, int], np.ndarray],
) -> jax.Array:
    """A tensor of `shape` and `dtype` stored C-ordered and little-endian, placed with
    `sharding`: this process reads only the blocks its devices hold, each byte once.

    When this process's blocks tile one box (one process of several holding a band of
    rows or columns; every block, in a run of one process), the box is read at once and
    each device's block is a view of it; otherwise each block is read by itself.
    """
    stored = np.dtype(dtype).newbyteorder("<")
    indices = sharding.addressable_devices_indices_map(shape).values()
    held = {_bounds(index, shape) for index in indices}
    lows = [min(b[axis][0] for b in held) for axis in range(len(shape))]
    highs = [max(b[axis][1] for b in held) for axis in range(len(shape))]
    box = tuple(zip(lows, highs))
    if sum(math.prod(b - a for a, b in bounds) for bounds in held) == math.prod(
        b - a for a, b in box
    ):
        whole = _read_values(box, shape, stored, read_range)
        blocks = {
            bounds: whole[tuple(slice(a - low, b - low) for (a, b), low in zip(bounds, lows))]
            for bounds in held
        }
    else:
        blocks = {bounds: _read_values(bounds, shape, stored, read_range) for bounds in held}
    return jax.make_array_from_callback(shape, sharding, lambda i: blocks[_bounds(i, shape)])


def _read_values(
    bounds: tuple[tuple[int, int], ...],
    shape: tuple[int, ...],
    dtype: np.dtype,
    read_range: Callable[[int, int], np.ndarray],
) -> np.ndarray:
    data = np.ascontiguousarray(read_block(bounds, shape, dtype.itemsize, read_range))
    return data.view(dtype).reshape(tuple(b - a for a, b in bounds))
