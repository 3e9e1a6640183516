"""Checkpoint files in a run of several JAX processes: who writes, who waits, what each
reads (the design: the package's README and docs/architecture.md). Process 0 claims each
numbered arrival by an atomic increment, so one that gave up and the writer never both own
it; every wait ends `timeout` seconds after the last progress any process told of."""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import logging
import math
import os
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

import jax
import numpy as np
from jax.experimental import multihost_utils

from ..._values import is_prng_key
from ._files import write_at
from ._source import OutTensor, PlannedTensor, SharedWrite

# `tc.save(..., timeout=)`: processes reach a save at nearly the same time (their steps
# wait on each other), so a long wait means a call on some processes only, or one stopped
DEFAULT_TIMEOUT_S = 300.0
# How often, at most, a process tells the others it is still writing
_PROGRESS_EVERY_S = 1.0
# An arrival carries its tree's description for naming a difference, up to this size
_DESCRIPTION_LIMIT = 1 << 20
_PREFIX = "treeclass/save"
# A process kept waiting for the others to call `tc.save` says so after this long (`_Notice`)
_NOTICE_AFTER_S = 10.0
_logger = logging.getLogger("treeclass")
# Coalesced reads (`coalesce`); GROUP_BYTES bounds the host memory a read takes
GAP_LIMIT = 1 << 20
OVER_READ = 2
GROUP_BYTES = 64 << 20

_RULE = (
    "in a run of several processes, a tree that holds arrays spread over processes ({spread}) is "
    "saved by all of them together: every process must call tc.save with the same tree and path"
)
_RAISE = "if the processes are only slow, pass a larger timeout= (seconds; {timeout:g} now)"
_NOT_EVERYWHERE = (
    "tc.save cannot write {path}: " + _RULE + ". Process {me} waited {timeout:g} s for "
    "{who} to call it, and {verb} not. Call tc.save on every process (outside any "
    "`if jax.process_index() == 0:`), or, " + _RAISE + ". (A tree with nothing spread "
    "over processes, such as NumPy or replicated arrays, is written by the process that "
    "calls tc.save, alone.)"
)
_DIFFERENT_CALLS = "tc.save cannot write {path}: " + _RULE + "; {difference}"
_STOPPED = (
    "tc.save cannot write {path}: process {me} waited {timeout:g} s for {what}, and no "
    "process of the save made progress meanwhile: one may have died or stopped. Or, " + _RAISE
)
_FAILED_ELSEWHERE = "tc.save on process 0 (the one that writes {path}) failed: {error}"
_NOT_SHARED = (
    "process {process} does not see the file {temp} that process 0 made. A sharded save "
    "on several processes is written by every process into one folder, which must be on "
    "a file system they all share"
)
_FAILED_ON = "tc.save of {path} failed on process {process}: {error}"
_GATHER_OUTSIDE_SAVE = (
    "the array at {where} is split across processes: only tc.save, called on every "
    "process, can gather it"
)
_BAD_TIMEOUT = "tc.save takes timeout= in seconds, a positive number; got {timeout!r}"
_WAITING = (
    "tc.save of {path} on process {me} is waiting for {who}: a tree that "
    "holds arrays spread over processes ({spread}) is saved by every process together. "
    "It gives up {timeout:g} s after the call (timeout=)."
)


Bounds = tuple[tuple[int, int], ...]  # a block of an array: `(start, stop)` per axis


class _KeyValueStore(Protocol):
    def blocking_key_value_get(self, key: str, timeout_in_ms: int) -> str: ...
    def key_value_set(self, key: str, value: str) -> None: ...
    def key_value_increment(self, key: str, increment: int) -> int: ...
    def key_value_delete(self, key: str) -> None: ...


def _bounds(index: tuple[slice, ...] | None, shape: tuple[int, ...]) -> Bounds:
    assert index is not None  # (jax's maps type an index as optional; a shard has one)
    # (a PRNG key array's shards may index its key data's trailing axis too)
    index = tuple(index)[: len(shape)] + (slice(None),) * (len(shape) - len(index))
    return tuple(s.indices(n)[:2] for s, n in zip(index, shape, strict=True))


def _extent(bounds: Bounds) -> tuple[int, ...]:
    return tuple(b - a for a, b in bounds)


def _key_data(array: jax.Array) -> jax.Array:
    return jax.random.key_data(array) if is_prng_key(array) else array


def _local_shards(array: jax.Array) -> dict[Bounds, jax.Array]:
    shards: dict[Bounds, jax.Array] = {}
    for shard in array.addressable_shards:
        shards.setdefault(_bounds(shard.index, array.shape), shard.data)
    return shards


class _HostView:
    """What a save reads of an array not fully addressable here (see `host_view`)."""

    def __init__(self, array: jax.Array, where: str, blocks: list, spread: bool, gathered: bool):
        self.array, self.where, self.blocks = array, where, blocks
        self.spread, self.gathered = spread, gathered
        # set by the save it is part of
        self.progress: Callable[[], None] | None = None
        self.announce: Callable[[], None] | None = None

    def gather(self) -> np.ndarray:
        # a collective: every process runs this, for the same tensors in the same order
        return np.asarray(multihost_utils.process_allgather(_key_data(self.array), tiled=True))

    def _values(self) -> np.ndarray:
        if self.gathered:
            if self.announce is None:
                raise ValueError(_GATHER_OUTSIDE_SAVE.format(where=self.where))
            self.announce()
            return self.gather()
        whole = tuple((0, n) for n in self.array.shape)
        out = None
        for bounds, data in _local_shards(self.array).items():
            block = np.asarray(_key_data(data))  # a single-device array: nothing collective
            if bounds == whole:  # a block that holds it all (a replicated array): that copy
                return block
            if out is None:
                out = np.empty(self.array.shape + block.shape[self.array.ndim :], block.dtype)
            out[tuple(slice(a, b) for a, b in bounds)] = block
        assert out is not None  # an array has at least one shard
        return out

    def __array__(self, dtype: np.dtype | None = None, copy: bool | None = None) -> np.ndarray:
        out = self._values()
        if self.progress is not None:
            self.progress()
        return out if dtype is None else out.astype(dtype)


def host_view(array: jax.Array, where: str) -> _HostView:
    """What a save reads of `array`: this process's shards if they hold it all, else a gather."""
    blocks = sorted(  # (device id, its process, its block)
        (device.id, device.process_index, _bounds(index, array.shape))
        for device, index in array.sharding.devices_indices_map(array.shape).items()
    )
    held: dict[int, set[Bounds]] = {}
    for _, process, bounds in blocks:
        held.setdefault(process, set()).add(bounds)
    # (the shards of one array are equal or disjoint)
    whole = {p: sum(math.prod(_extent(x)) for x in h) == array.size for p, h in held.items()}
    everywhere = len(whole) == jax.process_count() and all(whole.values())
    alone = everywhere or whole.get(0, False)  # process 0 can read it alone, when it writes
    return _HostView(array, where, blocks, spread=not everywhere, gathered=not alone)


# One save at a time per process, and the meetings' counters so far (the arrivals this
# process posted; on process 0 the next arrival of each other process), in step with
# the run's key-value store; the lock keeps two threads of one process apart.
_lock = threading.Lock()
_counters: dict[str, Any] = {"saves": 0, "arrivals": 0, "seen": {}}


def _client() -> _KeyValueStore:
    # The distributed runtime's client: its key-value store gives waits a timeout, which
    # collectives (`multihost_utils.sync_global_devices`) do not. JAX has no public name
    # for it; orbax uses the same one.
    from jax._src import distributed

    client = distributed.global_state.client
    if client is None:
        raise RuntimeError("tc.save in a run of several processes needs jax.distributed.initialize")
    return client


def _get(client: _KeyValueStore, key: str, timeout_s: float) -> str | None:
    try:
        return client.blocking_key_value_get(key, max(1, int(timeout_s * 1000)))
    except jax.errors.JaxRuntimeError as error:
        if "DEADLINE_EXCEEDED" in str(error):
            return None
        raise


class _Notice:
    """A wait for the others to call `tc.save` that logs a warning once if it lasts."""

    def __init__(self, timeout: float, text: Callable[[], str]) -> None:
        now = time.monotonic()
        self.at, self.deadline = now + min(_NOTICE_AFTER_S, timeout / 2), now + timeout
        self.text: Callable[[], str] | None = text

    def get(self, client: _KeyValueStore, key: str) -> str | None:
        if self.text is not None:
            posted = _get(client, key, self.at - time.monotonic())
            if posted is not None:
                return posted
            _logger.warning(self.text())
            self.text = None
        return _get(client, key, self.deadline - time.monotonic())


class _Save:
    """One save's messages: process 0 posts its numbered steps, the others read them in turn."""

    def __init__(self, client: _KeyValueStore, path: str, number: int, timeout: float) -> None:
        self.client, self.path, self.timeout = client, path, timeout
        self.key = f"{_PREFIX}/{number}"
        self.steps = 0  # posted (on process 0) or read (on the others) so far
        self._told = -math.inf

    def _name(self, name: str | None) -> str:
        if name is None:
            name, self.steps = f"step/{self.steps}", self.steps + 1
        return f"{self.key}/{name}"

    def post(self, message: dict[str, Any], name: str | None = None) -> None:
        """Post `message` as the next step, or at `name`."""
        self.client.key_value_set(self._name(name), json.dumps(message))

    def progress(self, now: bool = False) -> None:
        """Tell the others this process is at work (at most once a second, unless `now`)."""
        if now or time.monotonic() - self._told >= _PROGRESS_EVERY_S:
            self._told = time.monotonic()
            self.client.key_value_increment(f"{self.key}/progress", 1)

    def wait(self, what: str, name: str | None = None, bound: float | None = None) -> dict:
        """The next step (or the message at `name`), given up `bound` s after the last progress."""
        progress, bound, key = f"{self.key}/progress", bound or self.timeout, self._name(name)
        told = self.client.key_value_increment(progress, 0)
        while (posted := _get(self.client, key, bound)) is None:
            now = self.client.key_value_increment(progress, 0)
            if now == told:
                me = jax.process_index()
                raise TimeoutError(_STOPPED.format(path=self.path, me=me, timeout=bound, what=what))
            told = now
        return json.loads(posted)


def _sharded(value: object) -> str:
    """How a value is spread over devices, as a difference names it (a digest of its blocks:
    those tell whether process 0 can read it alone, too)."""
    if not isinstance(value, _HostView):
        return ""
    digest = hashlib.sha256(repr(value.blocks).encode()).hexdigest()[:12]
    spec = getattr(value.array.sharding, "spec", None)
    sharding = type(value.array.sharding).__name__ if spec is None else f"P{tuple(spec)!r}"
    return f" sharded {sharding} (device blocks {digest})"


def _entries(tensors: Sequence[PlannedTensor]) -> list[list[str]]:
    """Each tensor's key path, and what must be the same of it on every process."""
    return [[t.where, f"{t.dtype}{list(t.shape)}{_sharded(t.value)}"] for t in tensors]


def _describe(path: str, entries: list[list[str]]) -> str:
    """The path and tensors by a digest, with the list when small enough to name a difference."""
    text = json.dumps(entries).encode()
    digest, packed = hashlib.sha256(text).hexdigest(), base64.b64encode(zlib.compress(text))
    shown = packed.decode() if len(packed) <= _DESCRIPTION_LIMIT else None
    return json.dumps({"path": path, "digest": digest, "count": len(entries), "entries": shown})


def _difference(mine: list[list[str]], path: str, theirs: str, process: int) -> str | None:
    other = json.loads(theirs)
    if other["path"] != path:
        return f"process 0 saves to {path!r} but process {process} to {other['path']!r}"
    if other["digest"] == hashlib.sha256(json.dumps(mine).encode()).hexdigest():
        return None
    if other["entries"] is None:
        return (
            f"the trees of process 0 ({len(mine)} tensors) and process {process} "
            f"({other['count']} tensors) differ"
        )
    entries = json.loads(zlib.decompress(base64.b64decode(other["entries"])))
    for a, b in zip(mine, entries):
        if a[0] != b[0]:
            return (
                f"the trees differ first at {a[0]} on process 0, where process {process}'s "
                f"tree has {b[0]}"
            )
        if a != b:
            return (
                f"the trees differ first at {a[0]}: {a[1]} on process 0, {b[1]} on process "
                f"{process}"
            )
    if len(mine) > len(entries):
        return f"the trees differ first at {mine[len(entries)][0]}, which process {process}'s lacks"
    return f"the trees differ first at {entries[len(mine)][0]}, which process 0's lacks"


_REMOTE_ERRORS = {"ValueError": ValueError, "TimeoutError": TimeoutError, "OSError": OSError}


def _checked(message: dict[str, Any]) -> dict[str, Any]:
    """`message`, unless it tells of a failure: then that failure, raised here."""
    if "error" in message:
        kind, text = message["error"]
        raise _REMOTE_ERRORS.get(kind, RuntimeError)(text)
    return message


def save_from_processes(
    path: str,
    tensors: Sequence[PlannedTensor],
    write: Callable[[], None] | SharedWrite,
    timeout: float,
) -> None:
    """Write `path` by `write`: alone when no value needs another process, else with all."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(_BAD_TIMEOUT.format(timeout=timeout))
    if not 0 < timeout < math.inf:
        raise ValueError(_BAD_TIMEOUT.format(timeout=timeout))
    spread = [t.where for t in tensors if isinstance(t.value, _HostView) and t.value.spread]
    if jax.process_count() > 1 and spread:
        named = ", ".join(spread[:3]) + (", ..." if len(spread) > 3 else "")
        with _lock:
            first = jax.process_index() == 0
            save = (_meet_as_process_0 if first else _meet)(path, tensors, named, timeout)
            if isinstance(write, SharedWrite):
                (_share_as_process_0 if first else _share)(save, tensors, write)
            elif first:
                _write_as_process_0(save, tensors, write)
            else:
                _take_part(save, tensors)
    elif not isinstance(write, SharedWrite):
        write()
    else:  # a sharded save this process makes alone
        state = write.begin()
        try:
            _write_mine(tensors, write, state)
        except BaseException:
            write.abort(state)
            raise
        write.finish(state)


def _named(processes: list[int]) -> str:
    return f"process {processes[0]}" if len(processes) == 1 else f"processes {processes}"


def _meet_as_process_0(
    path: str, tensors: Sequence[PlannedTensor], spread: str, timeout: float
) -> _Save:
    """Process 0's side of the meeting: every other process arrived with the same call."""
    client, count = _client(), jax.process_count()
    number = _counters["saves"]
    _counters["saves"] += 1
    seen: dict[int, int] = _counters["seen"]
    mine = _entries(tensors)
    arrived: dict[int, tuple[int, str]] = {}
    said = {"path": path, "spread": spread, "timeout": timeout, "me": 0}

    def waiting() -> str:
        who = _named([p for p in range(1, count) if p not in arrived]) + " to call it too"
        return _WAITING.format(**said, who=who)

    wait = _Notice(timeout, waiting)
    for process in range(1, count):
        while process not in arrived:
            k = seen.get(process, 0)
            theirs = wait.get(client, f"{_PREFIX}/arrive/{process}/{k}")
            if theirs is None:
                break
            seen[process] = k + 1
            if client.key_value_increment(f"{_PREFIX}/claim/{process}/{k}", 1) == 1:
                arrived[process] = (k, theirs)
            # else: that process gave up on this arrival before we claimed it: its next
    missing = [p for p in range(1, count) if p not in arrived]
    found = (_difference(mine, path, theirs, p) for p, (_, theirs) in arrived.items())
    difference = None if missing else next((d for d in found if d is not None), None)
    answer: dict[str, Any] = {"save": number}
    if missing:
        verb = "it did" if len(missing) == 1 else "they did"
        text = _NOT_EVERYWHERE.format(**said, who=_named(missing), verb=verb)
        answer = {"error": ["TimeoutError", text]}
    elif difference is not None:
        answer = {"error": ["ValueError", _DIFFERENT_CALLS.format(**said, difference=difference)]}
    for process, (k, _) in arrived.items():
        client.key_value_set(f"{_PREFIX}/reply/{process}/{k}", json.dumps(answer))
    _checked(answer)
    if number > 0:  # every process has finished the previous save: its steps can go
        client.key_value_delete(f"{_PREFIX}/{number - 1}")
    return _Save(client, path, number, timeout)


def _meet(path: str, tensors: Sequence[PlannedTensor], spread: str, timeout: float) -> _Save:
    """Another process's side of the meeting: this save, once process 0 has answered."""
    client, process = _client(), jax.process_index()
    k = _counters["arrivals"]
    _counters["arrivals"] += 1
    client.key_value_set(f"{_PREFIX}/arrive/{process}/{k}", _describe(path, _entries(tensors)))
    said = {"path": path, "spread": spread, "timeout": timeout, "me": process}
    who = "process 0 to answer, which it does once every process has called it"
    text = _WAITING.format(**said, who=who)
    reply = _Notice(timeout, lambda: text).get(client, f"{_PREFIX}/reply/{process}/{k}")
    if reply is None:
        if client.key_value_increment(f"{_PREFIX}/claim/{process}/{k}", 1) == 1:
            who = "process 0 to answer (it answers once every process has called it)"
            raise TimeoutError(_NOT_EVERYWHERE.format(**said, verb="it did", who=who))
        # process 0 claimed our arrival just now: its answer is on its way
        reply = _get(client, f"{_PREFIX}/reply/{process}/{k}", timeout)
        if reply is None:
            what = "process 0 to answer its call, which process 0 had seen"
            raise TimeoutError(_STOPPED.format(**said, what=what))
    for key in ("arrive", "reply", "claim"):
        client.key_value_delete(f"{_PREFIX}/{key}/{process}/{k}")
    return _Save(client, path, _checked(json.loads(reply))["save"], timeout)


def _outcome(path: str, failure: BaseException, process: int = 0) -> dict[str, Any]:
    kind = "OSError" if isinstance(failure, OSError) else type(failure).__name__
    text = _FAILED_ON if process else _FAILED_ELSEWHERE
    return {"error": [kind, text.format(path=path, process=process, error=failure)]}


def _write_as_process_0(save: _Save, tensors: Sequence[PlannedTensor], write: Callable) -> None:
    views = [(i, t.value) for i, t in enumerate(tensors) if isinstance(t.value, _HostView)]
    for index, value in views:
        value.progress = save.progress
        value.announce = functools.partial(save.post, {"gather": index}) if value.gathered else None
    outcome: dict[str, Any] = {"done": True}
    try:
        write()
    except BaseException as failure:
        outcome = _outcome(save.path, failure)
        raise
    finally:
        for _, value in views:
            value.progress = value.announce = None
        save.post(outcome)


def _take_part(save: _Save, tensors: Sequence[PlannedTensor]) -> None:
    what = f"process 0 to go on writing {save.path} (step {{}})"
    while "gather" in (message := _checked(save.wait(what.format(save.steps)))):
        gathered = tensors[message["gather"]].value
        assert isinstance(gathered, _HostView) and gathered.gathered  # (planned alike)
        gathered.gather()  # the result is process 0's to write


class _Piece(NamedTuple):
    tensor: int
    bounds: Bounds  # on the stored shape
    holders: tuple[int, ...]
    nbytes: int


def _pieces(index: int, planned: PlannedTensor, out: OutTensor, alone: bool) -> list[_Piece]:
    """The distinct blocks of a planned tensor, with the processes that hold each."""
    stored = tuple(planned.shape)
    whole = tuple((0, n) for n in stored)
    if alone or not isinstance(planned.value, _HostView) or out.nbytes == 0:
        writer = jax.process_index() if alone else 0
        return [_Piece(index, whole, (writer,), out.nbytes)] if out.nbytes else []
    trailing = whole[planned.value.array.ndim :]  # a key's data, or a raw-bytes axis: whole
    holders: dict[Bounds, set[int]] = {}
    for _, process, bounds in planned.value.blocks:
        holders.setdefault(bounds + trailing, set()).add(process)
    itemsize = out.nbytes // math.prod(stored)
    pieces = [
        _Piece(index, bounds, tuple(sorted(who)), itemsize * math.prod(_extent(bounds)))
        for bounds, who in sorted(holders.items())
    ]
    if sum(p.nbytes for p in pieces) != out.nbytes:  # blocks that overlap: not a tiling
        raise ValueError(
            f"the array at {planned.where} has a sharding whose blocks overlap; a sharded "
            "save on several processes writes each block once"
        )
    return pieces


def balance(pieces: Sequence[tuple[int, Sequence[int]]], count: int) -> list[list[tuple]]:
    """`(process, start, stop)` byte ranges per `(nbytes, holders)` piece, totals evened out."""
    load = [0] * count
    parts: list[list[tuple]] = [[] for _ in pieces]
    for i, (nbytes, holders) in enumerate(pieces):
        if len(holders) == 1 and nbytes:
            parts[i] = [(holders[0], 0, nbytes)]
            load[holders[0]] += nbytes
    flexible = [i for i, (n, holders) in enumerate(pieces) if len(holders) > 1 and n]
    flexible.sort(key=lambda i: (len(pieces[i][1]), -pieces[i][0], i))
    for i in flexible:
        nbytes, holders = pieces[i]
        order = sorted(holders, key=lambda p: (load[p], p))
        # the fewest holders raised to one level that takes all of the piece
        for k in range(1, len(order) + 1):
            total = nbytes + sum(load[p] for p in order[:k])
            if k == len(order) or total <= k * load[order[k]]:
                break
        level, extra = divmod(total, k)
        start = 0
        for j, process in enumerate(order[:k]):
            share = level + (1 if j < extra else 0) - load[process]
            if share > 0:
                parts[i].append((process, start, start + share))
                load[process] += share
                start += share
    return parts


def _runs(bounds: Bounds, shape: tuple[int, ...], itemsize: int) -> tuple[np.ndarray, int]:
    """The block `bounds` of a C-ordered tensor as `chunk` bytes at each of `offsets`."""
    extent = _extent(bounds)
    if 0 in extent:
        return np.zeros(0, np.int64), 0
    cut = [axis for axis in range(len(shape)) if bounds[axis] != (0, shape[axis])]
    strides = [itemsize * math.prod(shape[axis + 1 :]) for axis in range(len(shape))]
    if not cut:
        return np.zeros(1, np.int64), itemsize * math.prod(shape)
    last = cut[-1]
    offsets = np.zeros(1, np.int64)
    for axis in range(last):
        rows = np.arange(bounds[axis][0], bounds[axis][1], dtype=np.int64) * strides[axis]
        offsets = np.add.outer(offsets, rows).reshape(-1)
    return offsets + bounds[last][0] * strides[last], extent[last] * strides[last]


def _block_bytes(
    planned: PlannedTensor, out: OutTensor, piece: _Piece, low: int, high: int, alone: bool
) -> tuple[np.ndarray, int]:
    """`(bytes, start)` spanning this process's bytes `low:high` of `piece`, copied sparingly."""
    if alone or not isinstance(planned.value, _HostView):
        return out.whole(), 0
    array = planned.value.array
    block = _local_shards(array)[piece.bounds[: array.ndim]]
    start = 0
    if block.ndim and block.shape[0] > 1 and (low, high) != (0, piece.nbytes):
        row = piece.nbytes // block.shape[0]
        first, last = low // row, -(-high // row)
        block, start = block[first:last], first * row
    data = np.ascontiguousarray(np.asarray(_key_data(block))).reshape(-1).view(np.uint8)
    return data, start


def _write_mine(
    tensors: Sequence[PlannedTensor],
    write: SharedWrite,
    state: dict[str, Any],
    progress: Callable[[], None] | None = None,
) -> None:
    """Write this process's share of every tensor (all of it when alone)."""
    me, count, alone = jax.process_index(), jax.process_count(), progress is None
    outs = list(write.tensors)
    pieces = [
        piece
        for i, (planned, out) in enumerate(zip(tensors, outs, strict=True))
        for piece in _pieces(i, planned, out, alone)
    ]
    parts = balance([(p.nbytes, p.holders) for p in pieces], count)
    places = write.places(state)
    descriptors: dict[str, int] = {}
    try:
        for piece, ranges in zip(pieces, parts, strict=True):
            mine = [(a, b) for process, a, b in ranges if process == me]
            if not mine:
                continue
            planned, out = tensors[piece.tensor], outs[piece.tensor]
            low, high = min(a for a, _ in mine), max(b for _, b in mine)
            data, start = _block_bytes(planned, out, piece, low, high, alone)
            file, base = places[piece.tensor]
            if file not in descriptors:
                try:
                    descriptors[file] = os.open(file, os.O_WRONLY | getattr(os, "O_BINARY", 0))
                except FileNotFoundError:
                    raise OSError(_NOT_SHARED.format(process=me, temp=file)) from None
            itemsize = out.nbytes // math.prod(planned.shape)
            offsets, chunk = _runs(piece.bounds, tuple(planned.shape), itemsize)
            for a, b in mine:
                for run in range(a // chunk, -(-b // chunk)):
                    low, high = max(a, run * chunk), min(b, (run + 1) * chunk)
                    at = base + int(offsets[run]) + low - run * chunk
                    write_at(descriptors[file], data[low - start : high - start], at)
            del data  # one block on the host at a time
            if progress is not None:
                progress()
    finally:
        for descriptor in descriptors.values():
            os.close(descriptor)


def _share_as_process_0(save: _Save, tensors: Sequence[PlannedTensor], write: SharedWrite) -> None:
    try:
        state = write.begin()
    except BaseException as begun:
        save.post(_outcome(save.path, begun))
        raise
    save.post({"begin": state})
    failure: BaseException | None = None
    try:
        _write_mine(tensors, write, state, save.progress)
    except BaseException as error:
        failure = error
    save.progress(now=True)
    remote: dict[str, Any] = {}  # the first failure another process told of
    late = False
    for process in range(1, jax.process_count()):
        what = f"process {process} to finish its share of {save.path}"
        try:  # once one has not finished in time, the others are not waited for again
            posted = save.wait(what, f"done/{process}", 0.001 if late else None)
        except TimeoutError as error:
            posted, late = {"error": ["TimeoutError", str(error)]}, True
        else:
            save.progress(now=True)
        if "error" in posted:
            remote = remote or posted
    outcome: dict[str, Any] = {"done": True}
    try:
        if failure is not None or remote:
            write.abort(state)
            if failure is not None:
                raise failure
            _checked(remote)
        write.finish(state)
    except BaseException as error:
        outcome = remote if remote and failure is None else _outcome(save.path, error)
        raise
    finally:
        save.post(outcome)


def _share(save: _Save, tensors: Sequence[PlannedTensor], write: SharedWrite) -> None:
    process = jax.process_index()
    what = f"process 0 to make the files of {save.path}"
    state = _checked(save.wait(what))["begin"]
    failure: BaseException | None = None
    done: dict[str, Any] = {"done": True}
    try:
        _write_mine(tensors, write, state, save.progress)
    except BaseException as error:
        failure, done = error, _outcome(save.path, error, process)
    save.post(done, f"done/{process}")
    try:  # process 0 may wait `timeout` for another process before it answers
        _checked(save.wait(f"process 0 to put {save.path} in place", bound=2 * save.timeout))
    finally:
        if failure is not None:  # ours, once process 0 has removed the files
            raise failure


def coalesce(offsets: np.ndarray, chunk: int) -> list[tuple[int, int, int]]:
    """`(first run, count, pitch)` reads of runs of `chunk` bytes, near ones together."""
    n = len(offsets)
    if n == 0:
        return []
    pitches = np.diff(offsets)
    joins = (pitches <= OVER_READ * chunk) & (pitches - chunk <= GAP_LIMIT)
    # where the pitch or joining changes: the end (exclusive) of each stretch of pitches
    changes = np.flatnonzero((pitches[1:] != pitches[:-1]) | (joins[1:] != joins[:-1])) + 1
    ends = np.append(changes, len(pitches))
    reads: list[tuple[int, int, int]] = []
    run = 0
    while run < n:
        if run < n - 1 and joins[run]:
            pitch = int(pitches[run])
            end = int(ends[np.searchsorted(ends, run, side="right")])  # last run joined: end
            count = min(end - run + 1, max(1, (GROUP_BYTES - chunk) // pitch + 1))
            reads.append((run, count, pitch))
            run += count
        else:
            reads.append((run, 1, chunk))
            run += 1
    return reads


def read_block(
    bounds: Bounds,
    shape: tuple[int, ...],
    itemsize: int,
    read_range: Callable[[int, int], np.ndarray],
) -> np.ndarray:
    """The block `bounds` of a C-ordered tensor as `uint8` (one more axis), in few reads."""
    extent = _extent(bounds)
    offsets, chunk = _runs(bounds, shape, itemsize)
    if len(offsets) == 1:
        start = int(offsets[0])
        return read_range(start, start + chunk).reshape(*extent, itemsize)
    out = np.empty(len(offsets) * chunk, np.uint8)
    for first, count, pitch in coalesce(offsets, chunk):
        start = int(offsets[first])
        data = np.ascontiguousarray(read_range(start, start + (count - 1) * pitch + chunk))
        rows = np.lib.stride_tricks.as_strided(data, (count, chunk), (pitch, 1), writeable=False)
        out[first * chunk : (first + count) * chunk].reshape(count, chunk)[...] = rows
    return out.reshape(*extent, itemsize)


def place_by_slices(
    shape: tuple[int, ...],
    dtype: np.dtype,
    sharding: jax.sharding.Sharding,
    read_range: Callable[[int, int], np.ndarray],
) -> jax.Array:
    """A stored tensor placed with `sharding`, reading only this process's blocks, once."""
    stored = np.dtype(dtype).newbyteorder("<")

    def values(bounds: Bounds) -> np.ndarray:
        data = np.ascontiguousarray(read_block(bounds, shape, stored.itemsize, read_range))
        return data.view(stored).reshape(_extent(bounds))

    indices = sharding.addressable_devices_indices_map(shape).values()
    held = {_bounds(index, shape) for index in indices}
    lows = [min(b[axis][0] for b in held) for axis in range(len(shape))]
    highs = [max(b[axis][1] for b in held) for axis in range(len(shape))]
    box = tuple(zip(lows, highs))
    if sum(math.prod(_extent(bounds)) for bounds in held) == math.prod(_extent(box)):
        whole = values(box)
        blocks = {
            bounds: whole[tuple(slice(a - low, b - low) for (a, b), low in zip(bounds, lows))]
            for bounds in held
        }
    else:
        blocks = {bounds: values(bounds) for bounds in held}
    return jax.make_array_from_callback(shape, sharding, lambda i: blocks[_bounds(i, shape)])
