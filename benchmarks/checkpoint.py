"""The checkpoint cases: save and load one model with `tc.save`/`tc.load` and the usual tools.

One model of `layers` layers, each a `f32[width, width]` weight and a `f32[width]` bias
(64 layers of width 2048 by default: 1 GiB), is written and read back by

- treeclass: `tc.save(path, model)` and `tc.load(path, like)`, `like` an abstract model
  (`jax.eval_shape`), as a user restoring into a fresh process does;
- safetensors (its NumPy API): `save_file` of the leaves by key path, `load_file`, then
  `jnp.asarray` per leaf into the nested dict;
- NumPy: `np.savez` and `np.load`, likewise;
- orbax: `StandardCheckpointer().save` of the nested dict (waiting until the write has
  finished) and `restore` into its abstract template;
- equinox: `tree_serialise_leaves` and `tree_deserialise_leaves` into an abstract
  `equinox.Module` model.

Every implementation holds the same arrays; a load must give them back (checked before
anything is timed). Files live in one temporary folder, removed when the process ends,
by default in memory (`/dev/shm` where it exists and has room): there a save or load
costs what the library does, not what the disk does, and no writeback of an earlier
round's gigabyte slows the next. `--checkpoint-dir` puts them on a disk instead (then
a save's time depends on the filesystem: ext4, for one, starts writing a file's data
back when it replaces another by rename or truncation). Timing is wall-clock, one save
or load per sample. Before each save the implementation's previous file is removed,
untimed, so every writer writes a new file: `tc.save` always does (it renames a finished
temporary file over the old one), while the others truncate and overwrite in place, and
on a VM that returns freed pages to its host a writer that keeps the old file until the
new one is complete would pay to fault in a gigabyte of fresh pages, which is the
machine's cost, not the library's.

**Peak memory.** The save case also measures, for each implementation, the extra host
memory a save takes at its peak: a fresh interpreter builds the model, then the kernel's
record of the process's peak resident memory is reset (`/proc/self/clear_refs`, Linux),
the model is saved, and the peak minus the resident memory before the save is the
extra. This sees every allocation (Python, NumPy, Rust, C++ threads), which `tracemalloc`
would not. Where the reset is not possible the child samples its resident memory every
millisecond from a thread instead (with psutil), which can miss a short peak. The child
runs on JAX's CPU backend (`JAX_PLATFORMS=cpu`) whatever the suite runs on: a TPU is held
by one process, the suite's. Run `python -m benchmarks.checkpoint --help` for the
child's command line.
"""

from __future__ import annotations

import argparse
import atexit
import functools
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .cases import Case, Entry, Target, canonical
from .peers import PeerMissing, import_peer
from .timing import Prepared, one_call_per_sample

__all__ = ["CheckpointSize", "DEFAULT_MB", "checkpoint_cases", "default_folder", "size_for_mb"]

DEFAULT_MB = 1024
_WIDTH = 2048
_IMPLEMENTATIONS = ("treeclass", "safetensors", "numpy", "orbax", "equinox")
_LABELS = {
    "treeclass": "treeclass",
    "safetensors": "safetensors (numpy API)",
    "numpy": "np.savez / np.load",
    "orbax": "orbax StandardCheckpointer",
    "equinox": "equinox tree_serialise_leaves",
}
# implementation -> (module imported, what to pip install)
_NEEDS = {
    "safetensors": ("safetensors", "safetensors"),
    "orbax": ("orbax.checkpoint", "orbax-checkpoint"),
    "equinox": ("equinox", "equinox"),
}
_MEMORY_TIMEOUT_S = 600


@dataclass(frozen=True)
class CheckpointSize:
    """`layers` layers of a `f32[width, width]` weight and a `f32[width]` bias."""

    layers: int
    width: int

    @property
    def nbytes(self) -> int:
        return self.layers * self.width * (self.width + 1) * 4

    @property
    def largest_leaf(self) -> int:
        return self.width * self.width * 4

    @property
    def label(self) -> str:
        for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
            if self.nbytes >= scale:
                return f"{self.nbytes / scale:.3g} {unit}"
        return f"{self.nbytes} bytes"


def size_for_mb(mb: float) -> CheckpointSize:
    """Layers of width 2048 (16 MiB each) adding up to about `mb` MiB (at least one)."""
    return CheckpointSize(layers=max(1, round(mb * 2**20 / (_WIDTH * _WIDTH * 4))), width=_WIDTH)


# -- the shared arrays and models -----------------------------------------------------------


def _numpy_layers(size: CheckpointSize) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(2048)
    return [
        (
            rng.standard_normal((size.width, size.width), dtype=np.float32),
            rng.standard_normal((size.width,), dtype=np.float32),
        )
        for _ in range(size.layers)
    ]


def _jax_layers(size: CheckpointSize) -> list[tuple[Any, Any]]:
    import jax

    layers = []
    for weight, bias in _numpy_layers(size):
        # one layer at a time, so that building the model never holds two copies of it
        layers.append((jax.device_put(weight), jax.device_put(bias)))
        del weight, bias
    return jax.block_until_ready(layers)


def _nested(layers: list[tuple[Any, Any]]) -> dict[str, Any]:
    return {"layers": [{"weight": w, "bias": b} for w, b in layers]}


def _flat(layers: list[tuple[Any, Any]]) -> dict[str, Any]:
    flat = {}
    for i, (w, b) in enumerate(layers):
        flat[f"layers.{i}.weight"], flat[f"layers.{i}.bias"] = w, b
    return flat


def _unflat(flat: dict[str, Any], count: int) -> dict[str, Any]:
    import jax.numpy as jnp

    return {
        "layers": [
            {
                "weight": jnp.asarray(flat[f"layers.{i}.weight"]),
                "bias": jnp.asarray(flat[f"layers.{i}.bias"]),
            }
            for i in range(count)
        ]
    }


def _treeclass_model(layers: list[tuple[Any, Any]]) -> Any:
    from .peers import get_kit

    kit = get_kit("treeclass")
    return kit.mlp([kit.linear(w, b) for w, b in layers])


def _equinox_model(layers: list[tuple[Any, Any]]) -> Any:
    from .peers import get_kit

    kit = get_kit("equinox")
    return kit.mlp([kit.linear(w, b) for w, b in layers])


class _Savers:
    """Save and load functions per implementation, over one folder and one set of arrays."""

    def __init__(
        self, size: CheckpointSize, folder: str, layers: list[tuple[Any, Any]], prefix: str = ""
    ):
        self.size, self.folder, self.layers, self.prefix = size, folder, layers, prefix

    def path(self, name: str) -> str:
        suffix = {"numpy": ".npz", "orbax": "", "equinox": ".eqx"}.get(name, ".safetensors")
        return os.path.join(self.folder, f"{self.prefix}{name}{suffix}")

    def save(self, name: str) -> Callable[[], None]:
        """`name`'s save, as a `Prepared` whose preparation removes the previous file."""
        fn = self._save(name)
        return Prepared(fn, functools.partial(_remove, self.path(name)))

    def _save(self, name: str) -> Callable[[], None]:
        path, layers = self.path(name), self.layers
        if name == "treeclass":
            import treeclass as tc

            model = _treeclass_model(layers)
            return lambda: tc.save(path, model)
        if name == "safetensors":
            from safetensors.numpy import save_file

            flat = _flat(layers)
            return lambda: save_file({k: np.asarray(v) for k, v in flat.items()}, path)
        if name == "numpy":
            flat = _flat(layers)
            return lambda: np.savez(path, **{k: np.asarray(v) for k, v in flat.items()})
        if name == "orbax":
            import orbax.checkpoint as ocp

            checkpointer, state = ocp.StandardCheckpointer(), _nested(layers)

            def save_orbax() -> None:
                checkpointer.save(path, state, force=True)
                checkpointer.wait_until_finished()

            return save_orbax
        if name == "equinox":
            import equinox as eqx

            model = _equinox_model(layers)
            return lambda: eqx.tree_serialise_leaves(path, model)
        raise ValueError(f"unknown implementation {name!r}")

    def load(self, name: str) -> Callable[[], Any]:
        import jax

        path, layers, count = self.path(name), self.layers, self.size.layers
        self.save(name)()  # the file this row reads
        if name == "treeclass":
            import treeclass as tc

            like = jax.eval_shape(lambda: _treeclass_model(layers))
            return lambda: tc.load(path, like)
        if name == "safetensors":
            from safetensors.numpy import load_file

            return lambda: _unflat(load_file(path), count)
        if name == "numpy":

            def load_numpy() -> Any:
                with np.load(path) as archive:
                    return _unflat({k: archive[k] for k in archive.files}, count)

            return load_numpy
        if name == "orbax":
            import orbax.checkpoint as ocp

            checkpointer = ocp.StandardCheckpointer()
            like = jax.eval_shape(lambda: _nested(layers))
            return lambda: checkpointer.restore(path, like)
        if name == "equinox":
            import equinox as eqx

            like = jax.eval_shape(lambda: _equinox_model(layers))
            return lambda: eqx.tree_deserialise_leaves(path, like)
        raise ValueError(f"unknown implementation {name!r}")


def _remove(path: str) -> None:
    """Remove a file or (orbax) folder if it is there."""
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.exists(path):
        os.unlink(path)


_MEMORY_FOLDER = "/dev/shm"


def default_folder(size: CheckpointSize) -> str:
    """A RAM-backed folder with room for every implementation's file, else the temp dir."""
    room = (len(_IMPLEMENTATIONS) + 2) * size.nbytes
    try:
        if os.access(_MEMORY_FOLDER, os.W_OK) and shutil.disk_usage(_MEMORY_FOLDER).free > room:
            return _MEMORY_FOLDER
    except OSError:
        pass
    return tempfile.gettempdir()


@functools.cache
def _fixture(size: CheckpointSize, parent: str) -> _Savers:
    folder = tempfile.mkdtemp(prefix="treeclass-bench-ckpt-", dir=parent)
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return _Savers(size, folder, _jax_layers(size))


def cpu_child_env() -> dict[str, str]:
    """The environment of a child interpreter, pinned to JAX's CPU backend: on an
    accelerator that one process holds (a TPU), a child that asked for the device would
    fail; the host memory of a save is what the child measures."""
    return {**os.environ, "JAX_PLATFORMS": "cpu"}


def _module_missing(name: str) -> None:
    if name not in _NEEDS:
        return
    import_peer(*_NEEDS[name])


def _entries(size: CheckpointSize, kind: str, parent: str) -> list[Entry]:
    def build(name: str) -> Callable[[], Callable[[], Any]]:
        def make() -> Callable[[], Any]:
            _module_missing(name)
            savers = _fixture(size, parent)
            return savers.save(name) if kind == "save" else savers.load(name)

        return make

    canon = (lambda _: {}) if kind == "save" else canonical
    return [
        Entry(
            _LABELS[name],
            "treeclass" if name == "treeclass" else "peer",
            build(name),
            canon=canon,
            needs=("checkpoint",) if name == "treeclass" else (),
        )
        for name in _IMPLEMENTATIONS
    ]


def checkpoint_cases(
    size: CheckpointSize, memory: bool = True, folder: str | None = None
) -> list[Case]:
    """The save and the load case for a model of `size` (see the module docstring).

    **Arguments**

    - `size`: the model; `size_for_mb(1024)` is the default 1 GiB;
    - `memory`: also measure each save's peak extra host memory (one fresh interpreter
      per implementation);
    - `folder`: where the files go (a temporary folder is made inside it); by default
      `/dev/shm` where it has room, else the system's temp dir.
    """
    parent = folder or default_folder(size)
    where = (
        "in memory (/dev/shm): the cost of serialising, not of the disk"
        if parent == _MEMORY_FOLDER
        else f"in {parent} (a disk's speed is part of it)"
    )
    note = (
        f"Wall clock, one save or load per sample; files {where}. Before each save "
        "the implementation's previous file is removed, untimed, so every save writes "
        "a new file, as `tc.save` always does (a temporary file renamed over the old "
        "one, which survives a crash); on a VM that hands freed memory back to its "
        "host, a save that must keep the old file while writing pays to fault fresh "
        "pages in (here 2.8 s against 0.5 s for the same gigabyte)."
    )
    peers = tuple(_LABELS[name] for name in _IMPLEMENTATIONS if name != "treeclass")
    what = f"{size.layers} layers of f32[{size.width},{size.width}] + f32[{size.width}]"
    target = "<= 1.2x the fastest of safetensors, np.savez, orbax, equinox"
    return [
        Case(
            name="checkpoint_save",
            group="8. checkpoints",
            title=f"save a {size.label} model ({what}) to one file",
            entries=lambda: _entries(size, "save", parent),
            sync=None,
            target=Target(target, "max_ratio_fastest", 1.2, peers),
            plan=one_call_per_sample,
            extra=(lambda: measure_save_memory(size, parent)) if memory else None,
            note=note,
        ),
        Case(
            name="checkpoint_load",
            group="8. checkpoints",
            title=f"load the {size.label} model back into a model of JAX arrays",
            entries=lambda: _entries(size, "load", parent),
            sync=_block_tree,
            target=Target(target, "max_ratio_fastest", 1.2, peers),
            plan=one_call_per_sample,
            note=note,
        ),
    ]


def _block_tree(tree: Any) -> Any:
    import jax

    return jax.block_until_ready(tree)


# -- peak memory of a save, each in a fresh interpreter ----------------------------------


def measure_save_memory(size: CheckpointSize, parent: str) -> dict[str, Any]:
    """Peak extra host memory of each implementation's save, and the treeclass target.

    **Returns**

    `{"method": ..., "largest_leaf": bytes, "header": bytes or None, "rows": [...],
    "target": {...}}`; each row holds `name`, `extra` (bytes) or `note` (why not).
    """
    folder = _fixture(size, parent).folder
    rows, method, header = [], None, None
    for name in _IMPLEMENTATIONS:
        row: dict[str, Any] = {"name": _LABELS[name], "extra": None, "note": ""}
        rows.append(row)
        try:
            _module_missing(name)
        except PeerMissing as error:
            row["note"] = f"skipped: {error}"
            continue
        command = [
            sys.executable,
            "-m",
            "benchmarks.checkpoint",
            "--memory",
            name,
            "--layers",
            str(size.layers),
            "--width",
            str(size.width),
            "--folder",
            folder,
        ]
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=_MEMORY_TIMEOUT_S,
            cwd=_ROOT,
            env=cpu_child_env(),
        )
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode != 0 or not lines:
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1][:160]
            row["note"] = f"{'FAILED' if name == 'treeclass' else 'peer failed'}: {tail}"
            continue
        report = json.loads(lines[-1])
        if report.get("unavailable"):
            row["note"] = f"not available: {report['unavailable']}"
            continue
        row["extra"], method = report["extra"], report["method"]
        if name == "treeclass":
            header = report.get("header")
    limit_bytes = 1.2 * (size.largest_leaf + (header or 0))
    tc_row = rows[0]
    target: dict[str, Any] = {
        "text": "peak extra host memory of `tc.save` <= 1.2x (largest leaf + header)",
        "limit_bytes": limit_bytes,
    }
    if tc_row["extra"] is None:
        target.update(status=None, summary=f"not measured ({tc_row['note'] or 'no figure'})")
    else:
        met = tc_row["extra"] <= limit_bytes
        target.update(
            status="met" if met else "missed",
            summary=f"{'met' if met else 'missed'}: {tc_row['extra'] / 2**20:.1f} MiB "
            f"against {limit_bytes / 2**20:.1f} MiB (one measurement)",
        )
    return {
        "method": method,
        "largest_leaf": size.largest_leaf,
        "header": header,
        "rows": rows,
        "target": target,
    }


_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _rss_bytes() -> int:
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_bytes() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmHWM in /proc/self/status")


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as clear:
            clear.write("5")
        return True
    except OSError:
        return False


class _Sampler:
    """Samples the resident memory every millisecond from a thread (needs psutil)."""

    def __init__(self) -> None:
        import psutil

        self._process, self.peak = psutil.Process(), 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._process.memory_info().rss)
            time.sleep(0.001)

    def __enter__(self) -> _Sampler:
        self.peak = self._process.memory_info().rss
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


def _measure_child(name: str, size: CheckpointSize, folder: str) -> dict[str, Any]:
    if name == "treeclass":
        from .probes import probe

        reason = probe("checkpoint")
        if reason is not None:
            return {"unavailable": reason}
    savers = _Savers(size, folder, _jax_layers(size), prefix="memory-")
    save = savers.save(name)
    gc.collect()
    if _reset_peak():
        before = _rss_bytes()
        save()
        extra, method = (
            _peak_bytes() - before,
            ("the kernel's peak resident memory (VmHWM, reset through /proc/self/clear_refs)"),
        )
    else:
        with _Sampler() as sampler:
            before = sampler.peak
            save()
        extra, method = sampler.peak - before, "resident memory sampled every 1 ms (psutil)"
    header = None
    if name == "treeclass":
        with open(savers.path(name), "rb") as file:
            header = 8 + int.from_bytes(file.read(8), "little")
    target = savers.path(name)
    if os.path.isdir(target):
        shutil.rmtree(target, ignore_errors=True)
    elif os.path.exists(target):
        os.remove(target)
    return {"extra": max(0, extra), "method": method, "header": header}


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.checkpoint",
        description="Measure one save's peak extra host memory in this fresh interpreter "
        "(run by the checkpoint_save case; prints one JSON line).",
    )
    parser.add_argument("--memory", choices=_IMPLEMENTATIONS, required=True)
    parser.add_argument("--layers", type=int, required=True)
    parser.add_argument("--width", type=int, required=True)
    parser.add_argument("--folder", required=True)
    args = parser.parse_args(argv)
    report = _measure_child(args.memory, CheckpointSize(args.layers, args.width), args.folder)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
