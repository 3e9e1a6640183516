"""Loading a foreign safetensors file through key rules: `tc.load(..., rules=...)` against
`safetensors.numpy.load_file` plus assigning the arrays into the model by hand.

The file is what a PyTorch checkpoint looks like: 24 blocks named
`model.layers.{i}.self_attn.q_proj.weight` and so on, each of four `[w, w]` attention
matrices and an MLP's `[2w, w]` up and `[w, 2w]` down projections, all stored `[out, in]`;
about 1 GiB in the full run (w = 1184), 64 MiB with `--quick`. The model keeps its weights
`[in, out]` (TreeClass blocks in a list), so every tensor is transposed on the way in:

- treeclass: `tc.load(path, like, rules=RULES)`, `like` an abstract model
  (`jax.eval_shape`), each rule transposing (`lambda w: w.T`);
- baseline: `load_file(path)`, then `jax.tree_util.tree_map_with_path` over the same
  abstract model putting `jnp.asarray(tensors[name].T)` at each leaf: the same work by
  hand, holding the whole file in host memory first.

The target is treeclass within 1.2x of the baseline. After the timing, each load's peak
extra host memory is measured once with `tracemalloc` (which sees NumPy's buffers, not
the JAX arrays of the result): the target is about one tensor in flight beyond the
result, at most 2.5x the largest tensor (the tensor being read, plus the previous one,
which JAX's `device_put` of a transposed NumPy view keeps until its next transfer) plus
1 MiB that does not grow with the file (header, report, rule bookkeeping). The
file is written once to a temporary folder (in memory, `/dev/shm`, where it has room)
and removed when the case has run.
"""

from __future__ import annotations

import atexit
import functools
import gc
import math
import os
import shutil
import tempfile
import tracemalloc
from dataclasses import dataclass
from typing import Any

import numpy as np

from .cases import Case, Entry, Target
from .timing import one_call_per_sample

__all__ = [
    "ForeignSize",
    "foreign_case",
    "load_memory_report",
    "FULL_FOREIGN",
    "QUICK_FOREIGN",
    "SMOKE_FOREIGN",
]

_TREECLASS = "treeclass"  # (the runner finds the treeclass row by this name)
_BASELINE = "safetensors load_file + tree_map"
# block field -> (PyTorch name under model.layers.{i}, [out, in] shape in units of width)
_TENSORS = {
    "q": ("self_attn.q_proj.weight", (1, 1)),
    "k": ("self_attn.k_proj.weight", (1, 1)),
    "v": ("self_attn.v_proj.weight", (1, 1)),
    "o": ("self_attn.o_proj.weight", (1, 1)),
    "up": ("mlp.up_proj.weight", (2, 1)),
    "down": ("mlp.down_proj.weight", (1, 2)),
}
RULES = [
    (f"model.layers.{{i}}.{name}", f"blocks[{{i}}].{field}", lambda w: w.T)
    for field, (name, _) in _TENSORS.items()
]
# x the largest tensor: the one being read, and the one before it, whose host buffer
# `jax.device_put` of a non-contiguous (transposed) array lets go only at the next transfer
_MEMORY_LIMIT = 2.5
# plus what does not grow with the tensors: the parsed header, the report, the key rules'
# bookkeeping (about 0.5 MiB at the sizes here; it dominates only the small --quick file)
_MEMORY_FIXED = 2**20


@dataclass(frozen=True)
class ForeignSize:
    """`blocks` blocks of width `width` (eight `width**2` float32 matrices per block)."""

    blocks: int
    width: int

    @property
    def nbytes(self) -> int:
        return self.blocks * 8 * self.width**2 * 4

    @property
    def largest(self) -> int:
        return 2 * self.width**2 * 4

    @property
    def label(self) -> str:
        return f"{self.nbytes / 2**20:.0f} MiB"


def _size_for_mb(mb: float, blocks: int = 24) -> ForeignSize:
    width = int(math.sqrt(mb * 2**20 / (blocks * 8 * 4))) // 8 * 8
    return ForeignSize(blocks, max(width, 8))


FULL_FOREIGN = _size_for_mb(1024)
QUICK_FOREIGN = _size_for_mb(64)
SMOKE_FOREIGN = ForeignSize(blocks=2, width=16)


def _shape(field: str, width: int) -> tuple[int, int]:
    out, into = _TENSORS[field][1]
    return (out * width, into * width)


def _write(size: ForeignSize, path: str) -> None:
    from safetensors.numpy import save_file

    rng = np.random.default_rng(1184)
    tensors = {
        f"model.layers.{i}.{name}": rng.standard_normal(_shape(field, size.width), np.float32)
        for i in range(size.blocks)
        for field, (name, _) in _TENSORS.items()
    }
    save_file(tensors, path)


def _classes() -> tuple[type, type]:
    import jax

    import treeclass as tc

    class Block(tc.TreeClass):
        q: jax.Array  # [in, out]
        k: jax.Array
        v: jax.Array
        o: jax.Array
        up: jax.Array
        down: jax.Array

    class Model(tc.TreeClass):
        blocks: list

    return Block, Model


def _abstract(size: ForeignSize) -> Any:
    import jax

    block, model = _classes()

    def build() -> Any:
        import jax.numpy as jnp

        return model(
            [
                block(**{f: jnp.zeros(_shape(f, size.width)[::-1]) for f in _TENSORS})
                for _ in range(size.blocks)
            ]
        )

    return jax.eval_shape(build)


def _folder(size: ForeignSize, parent: str | None) -> str:
    if parent is None:
        parent = tempfile.gettempdir()
        try:
            if shutil.disk_usage("/dev/shm").free > 3 * size.nbytes:
                parent = "/dev/shm"
        except OSError:
            pass
    folder = tempfile.mkdtemp(prefix="treeclass-bench-foreign-", dir=parent)
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


@functools.cache
def _fixture(size: ForeignSize, parent: str | None) -> tuple[str, Any]:
    path = os.path.join(_folder(size, parent), "pytorch_model.safetensors")
    _write(size, path)
    return path, _abstract(size)


def _loads(size: ForeignSize, parent: str | None) -> dict[str, Any]:
    """The two loads, each a function of no arguments returning the model."""
    import jax
    import jax.numpy as jnp
    from safetensors.numpy import load_file

    import treeclass as tc

    path, like = _fixture(size, parent)
    names = {
        (i, field): f"model.layers.{i}.{name}"
        for i in range(size.blocks)
        for field, (name, _) in _TENSORS.items()
    }

    def treeclass_load() -> Any:
        return tc.load(path, like, rules=RULES)

    def baseline_load() -> Any:
        tensors = load_file(path)

        def put(keys: tuple, leaf: Any) -> Any:
            # keys: .blocks, [i], .field
            return jnp.asarray(tensors[names[keys[1].idx, keys[2].name]].T)

        return jax.tree_util.tree_map_with_path(put, like)

    return {_TREECLASS: treeclass_load, _BASELINE: baseline_load}


def _block(tree: Any) -> Any:
    import jax

    return jax.block_until_ready(tree)


def measure_memory(size: ForeignSize, parent: str | None) -> dict[str, Any]:
    """Each load's peak extra host memory under `tracemalloc`, then the file is removed."""
    path, _ = _fixture(size, parent)
    rows = []
    try:
        for name, load in _loads(size, parent).items():
            gc.collect()
            tracemalloc.start()
            try:
                result = _block(load())
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
            del result
            rows.append({"name": name, "extra": peak, "note": ""})
    finally:
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)
        _fixture.cache_clear()
    how = (
        "the peak of `tracemalloc` (NumPy's buffers; the JAX arrays of the result are not "
        "counted) over one load in this process"
    )
    return load_memory_report(rows, size.largest, _MEMORY_LIMIT, _MEMORY_FIXED, how)


def load_memory_report(
    rows: list[dict[str, Any]], largest: int, factor: float, fixed: int, how: str
) -> dict[str, Any]:
    """A load case's memory block: its rows (treeclass's first), judged against a peak of
    `factor` times the `largest` tensor plus `fixed` bytes, measured as `how` says."""
    limit = factor * largest + fixed
    ours = rows[0]["extra"]
    verdict = "met" if ours <= limit else "missed"
    return {
        "action": "load",
        "how": how,
        "method": "tracemalloc",
        "largest_leaf": largest,
        "header": None,
        "rows": rows,
        "target": {
            "text": f"peak extra host memory of the rules load <= {factor}x the largest "
            f"tensor + {fixed // 2**20} MiB",
            "limit_bytes": limit,
            "status": verdict,
            "summary": f"{verdict}: {ours / 2**20:.1f} MiB against {limit / 2**20:.1f} MiB "
            "(one measurement)",
        },
    }


def foreign_case(size: ForeignSize, folder: str | None = None) -> Case:
    """The case `checkpoint_foreign_rules` for a file of `size` (see the module docstring)."""

    def entries() -> list[Entry]:
        def build(name: str) -> Any:
            return lambda: _loads(size, folder)[name]

        return [
            Entry(
                _TREECLASS,
                "treeclass",
                build(_TREECLASS),
                note="tc.load(path, like, rules=...)",
                needs=("checkpoint",),
            ),
            Entry(_BASELINE, "baseline", build(_BASELINE), note="load_file, then tree_map"),
        ]

    what = f"{size.blocks} blocks of 6 PyTorch-style [out, in] weights, width {size.width}"
    return Case(
        name="checkpoint_foreign_rules",
        group="8. checkpoints",
        title=f"load a {size.label} foreign safetensors file ({what}) through key rules "
        "with transposes",
        entries=entries,
        sync=_block,
        modules=("safetensors",),
        target=Target("<= 1.2x load_file + tree_map", "max_ratio", 1.2, (_BASELINE,)),
        plan=one_call_per_sample,
        extra=lambda: measure_memory(size, folder),
        note="Wall clock, one load per sample, into an abstract model (`jax.eval_shape`); "
        "both transpose every tensor from `[out, in]`. The file is written once, untimed.",
    )
