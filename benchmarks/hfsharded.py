"""Loading a sharded checkpoint in Hugging Face's layout through key rules:
`tc.load(index, like, rules=...)` against the `safetensors` package plus assigning every
tensor into the model by hand.

The checkpoint is what `save_pretrained` writes for a GPT-2-style decoder: per-layer keys
`h.{i}.ln_1.weight`, `h.{i}.attn.c_attn.weight` (`[in, out]`, as GPT-2's `Conv1D` stores
them) and so on, the embeddings `wte.weight` and `wpe.weight` and the final `ln_f`,
split into several `model-0000X-of-0000N.safetensors` files tied by
`model.safetensors.index.json`. It is written in the setup (untimed) by the `safetensors`
package itself (`save_file`, one call per shard), about 1 GiB in the full run (24 layers
of width 960), 64 MiB with `--quick`.

The model names its parts its own way (`blocks[i].qkv.w`, `embed`, `norm.scale`), so
every tensor is renamed by a rule (`RULES`: one per tensor kind, the layer index a
capture):

- treeclass: `tc.load(index, like, rules=RULES)`, `like` an abstract model
  (`jax.eval_shape`);
- baseline: each shard opened with `safetensors.safe_open(..., framework="numpy")`, each
  tensor read with `get_tensor` and put on the device (`jnp.asarray`), and the model
  assembled by hand from those arrays: what one writes without a rule engine, one tensor
  on the host at a time.

The target is treeclass within 1.0x of the baseline. After the timing, each load's peak
extra host memory is measured once with `tracemalloc`: the peak of NumPy's buffers less
those the result still holds at the end (on the CPU backend a device array may alias an
aligned host buffer: that is the result, not extra). The target is about one tensor, at
most `_MEMORY_LIMIT` times the largest tensor plus 1 MiB that does not grow with the
model. JAX copies a host buffer to the device asynchronously and the transfer leaves a
cycle that keeps it until the garbage collector's next pass, so a load that reads the
next tensor before then holds both: treeclass waits for each large tensor's copy and
frees it first (the baseline, as written by hand, does not). The treeclass
row's note also gives the tensor bytes its reader read, and in how many reads (its byte
counters): each byte of the checkpoint once.

**The stacked model.** The model's blocks are one `tc.Stacked` (`STACKED = True`): the
rules put each per-layer key `h.{i}.…` into block i of the stacked leaves in the same
load, each tensor read once; the baseline stacks its hand-assembled blocks
(`tc.Stacked.from_blocks`), as one must without a rule engine. `STACKED = False` loads
the unrolled model (a list of blocks) with the same rules.
"""

from __future__ import annotations

import atexit
import functools
import gc
import json
import math
import os
import shutil
import tempfile
import tracemalloc
from dataclasses import dataclass
from typing import Any

import numpy as np

from .cases import Case, Entry, Target
from .foreign import load_memory_report
from .timing import one_call_per_sample

__all__ = ["HFSize", "hf_sharded_case", "FULL_HF", "QUICK_HF", "SMOKE_HF", "RULES", "STACKED"]

# The template's blocks: one `tc.Stacked` (True: rules map the per-layer keys onto its
# blocks in one load), or a list (False: the unrolled model, the same rules).
STACKED = True

_TREECLASS = "treeclass"  # (the runner finds the treeclass row by this name)
_BASELINE = "safetensors safe_open + assignment by hand"
# a block's tensors: HF name under h.{i} -> (the model's path under blocks[i], shape in
# units of the width; GPT-2's Conv1D keeps weights [in, out])
_BLOCK = {
    "ln_1.weight": ("norm1.scale", (1,)),
    "ln_1.bias": ("norm1.shift", (1,)),
    "attn.c_attn.weight": ("qkv.w", (1, 3)),
    "attn.c_attn.bias": ("qkv.b", (3,)),
    "attn.c_proj.weight": ("proj.w", (1, 1)),
    "attn.c_proj.bias": ("proj.b", (1,)),
    "ln_2.weight": ("norm2.scale", (1,)),
    "ln_2.bias": ("norm2.shift", (1,)),
    "mlp.c_fc.weight": ("up.w", (1, 4)),
    "mlp.c_fc.bias": ("up.b", (4,)),
    "mlp.c_proj.weight": ("down.w", (4, 1)),
    "mlp.c_proj.bias": ("down.b", (1,)),
}
# the rest: HF name -> (the model's path, shape in units of the width); a vocabulary of
# 4 x width tokens and as many positions as the width, so no tensor outgrows an MLP's
_TOP = {
    "wte.weight": ("embed", (4, 1)),
    "wpe.weight": ("positions", (1, 1)),
    "ln_f.weight": ("norm.scale", (1,)),
    "ln_f.bias": ("norm.shift", (1,)),
}
RULES = [(f"h.{{i}}.{name}", f"blocks[{{i}}].{path}") for name, (path, _) in _BLOCK.items()]
RULES += [(name, path) for name, (path, _) in _TOP.items()]
# x the largest tensor: the one being read and placed, with a little slack for the next
_MEMORY_LIMIT = 1.5
_MEMORY_FIXED = 2**20  # header, index, report and rule bookkeeping


@dataclass(frozen=True)
class HFSize:
    """`layers` GPT-2-style blocks of width `width`, in shards of about `shard_mb` MiB."""

    layers: int
    width: int
    shard_mb: float

    def shape(self, units: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(u * self.width for u in units)

    @property
    def nbytes(self) -> int:
        shapes = [s for _, s in _BLOCK.values()] * self.layers + [s for _, s in _TOP.values()]
        return 4 * sum(math.prod(self.shape(s)) for s in shapes)

    @property
    def largest(self) -> int:
        return 4 * 4 * self.width**2

    @property
    def label(self) -> str:
        return f"{self.nbytes / 2**20:.0f} MiB"


def _size_for_mb(mb: float, layers: int = 24, shards: int = 5) -> HFSize:
    width = int(math.sqrt(mb * 2**20 / ((12 * layers + 5) * 4))) // 32 * 32
    return HFSize(layers, max(width, 32), mb / shards)


FULL_HF = _size_for_mb(1024)
QUICK_HF = _size_for_mb(64)
SMOKE_HF = HFSize(layers=2, width=16, shard_mb=0.01)


def _tensors(size: HFSize) -> dict[str, tuple[int, ...]]:
    """Every HF name and its shape, in the order `save_pretrained` writes them."""
    out = {"wte.weight": size.shape(_TOP["wte.weight"][1])}
    out["wpe.weight"] = size.shape(_TOP["wpe.weight"][1])
    for i in range(size.layers):
        out.update({f"h.{i}.{name}": size.shape(units) for name, (_, units) in _BLOCK.items()})
    out["ln_f.weight"] = size.shape(_TOP["ln_f.weight"][1])
    out["ln_f.bias"] = size.shape(_TOP["ln_f.bias"][1])
    return out


def _write(size: HFSize, folder: str) -> str:
    """The sharded checkpoint, written by the `safetensors` package; the index's path."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(960)
    limit = size.shard_mb * 2**20
    groups: list[list[str]] = [[]]
    used = 0
    for name, shape in _tensors(size).items():
        nbytes = 4 * math.prod(shape)
        if groups[-1] and used + nbytes > limit:
            groups.append([])
            used = 0
        groups[-1].append(name)
        used += nbytes
    shapes = _tensors(size)
    weight_map = {}
    for n, group in enumerate(groups, 1):
        shard = f"model-{n:05d}-of-{len(groups):05d}.safetensors"
        tensors = {name: rng.standard_normal(shapes[name], np.float32) for name in group}
        save_file(tensors, os.path.join(folder, shard), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(group, shard))
        del tensors
    index = os.path.join(folder, "model.safetensors.index.json")
    with open(index, "w") as file:
        json.dump({"metadata": {"total_size": size.nbytes}, "weight_map": weight_map}, file)
    return index


def _classes() -> dict[str, type]:
    import jax

    import treeclass as tc

    class Norm(tc.TreeClass):
        scale: jax.Array
        shift: jax.Array

    class Linear(tc.TreeClass):
        w: jax.Array  # [in, out]
        b: jax.Array

    class Block(tc.TreeClass):
        norm1: Norm
        qkv: Linear
        proj: Linear
        norm2: Norm
        up: Linear
        down: Linear

    class Model(tc.TreeClass):
        embed: jax.Array
        positions: jax.Array
        blocks: Any  # a list of blocks, or one tc.Stacked of them
        norm: Norm

    return {"Norm": Norm, "Linear": Linear, "Block": Block, "Model": Model}


def _build(get: Any, layers: int) -> Any:
    """The model from `get(hf_name)`, one array per tensor: the hand-written assignment."""
    import treeclass as tc

    c = _classes()
    norm, linear = c["Norm"], c["Linear"]
    blocks = [
        c["Block"](
            norm1=norm(get(f"h.{i}.ln_1.weight"), get(f"h.{i}.ln_1.bias")),
            qkv=linear(get(f"h.{i}.attn.c_attn.weight"), get(f"h.{i}.attn.c_attn.bias")),
            proj=linear(get(f"h.{i}.attn.c_proj.weight"), get(f"h.{i}.attn.c_proj.bias")),
            norm2=norm(get(f"h.{i}.ln_2.weight"), get(f"h.{i}.ln_2.bias")),
            up=linear(get(f"h.{i}.mlp.c_fc.weight"), get(f"h.{i}.mlp.c_fc.bias")),
            down=linear(get(f"h.{i}.mlp.c_proj.weight"), get(f"h.{i}.mlp.c_proj.bias")),
        )
        for i in range(layers)
    ]
    return c["Model"](
        embed=get("wte.weight"),
        positions=get("wpe.weight"),
        blocks=tc.Stacked.from_blocks(blocks) if STACKED else blocks,
        norm=norm(get("ln_f.weight"), get("ln_f.bias")),
    )


def _abstract(size: HFSize) -> Any:
    import jax
    import jax.numpy as jnp

    shapes = _tensors(size)
    return jax.eval_shape(lambda: _build(lambda name: jnp.zeros(shapes[name]), size.layers))


def _folder(size: HFSize, parent: str | None) -> str:
    if parent is None:
        parent = tempfile.gettempdir()
        try:
            if shutil.disk_usage("/dev/shm").free > 3 * size.nbytes:
                parent = "/dev/shm"
        except OSError:
            pass
    folder = tempfile.mkdtemp(prefix="treeclass-bench-hf-", dir=parent)
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


@functools.cache
def _fixture(size: HFSize, parent: str | None) -> tuple[str, Any]:
    return _write(size, _folder(size, parent)), _abstract(size)


def _loads(size: HFSize, parent: str | None) -> dict[str, Any]:
    """The two loads, each a function of no arguments returning the model."""
    import jax.numpy as jnp
    from safetensors import safe_open

    import treeclass as tc

    index, like = _fixture(size, parent)
    folder = os.path.dirname(index)

    def treeclass_load() -> Any:
        return tc.load(index, like, rules=RULES)

    def baseline_load() -> Any:
        with open(index) as file:
            weight_map = json.load(file)["weight_map"]
        arrays = {}
        for shard in sorted(set(weight_map.values())):
            with safe_open(os.path.join(folder, shard), framework="numpy") as tensors:
                for name in tensors.keys():  # noqa: SIM118 (a safe_open handle, not a dict)
                    arrays[name] = jnp.asarray(tensors.get_tensor(name))
        return _build(arrays.__getitem__, size.layers)

    return {_TREECLASS: treeclass_load, _BASELINE: baseline_load}


def _block(tree: Any) -> Any:
    import jax

    return jax.block_until_ready(tree)


def measure_memory(size: HFSize, parent: str | None) -> dict[str, Any]:
    """Each load's peak extra host memory under `tracemalloc` (and the bytes treeclass
    read, from its counters), then the files are removed."""
    from treeclass._checkpoint.files._files import IO

    index, _ = _fixture(size, parent)
    rows = []
    try:
        for name, load in _loads(size, parent).items():
            gc.collect()
            IO.reset()
            tracemalloc.start()
            try:
                result = _block(load())
                held, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            del result
            # on the CPU backend a device array may be an aligned NumPy buffer itself: the
            # result's memory, not extra
            note = f"{held / 2**20:.1f} MiB of NumPy buffers kept by the result"
            if name == _TREECLASS:  # what treeclass's reader moved, by its own counters
                note += f"; read {IO.read_bytes} of {size.nbytes} tensor bytes in {IO.reads} reads"
            rows.append({"name": name, "extra": peak - held, "note": note})
    finally:
        shutil.rmtree(os.path.dirname(index), ignore_errors=True)
        _fixture.cache_clear()
    how = (
        "the peak of `tracemalloc` (NumPy's buffers) over one load in this process, less the "
        "buffers the result still holds at its end (on the CPU backend a device array may "
        "alias its host buffer)"
    )
    return load_memory_report(rows, size.largest, _MEMORY_LIMIT, _MEMORY_FIXED, how)


def hf_sharded_case(size: HFSize, folder: str | None = None) -> Case:
    """The case `checkpoint_hf_sharded_rules` for a checkpoint of `size` (see the module
    docstring)."""

    def entries() -> list[Entry]:
        def build(name: str) -> Any:
            return lambda: _loads(size, folder)[name]

        return [
            Entry(
                _TREECLASS,
                "treeclass",
                build(_TREECLASS),
                note="tc.load(index, like, rules=...)",
                needs=("checkpoint",),
            ),
            Entry(_BASELINE, "baseline", build(_BASELINE), note="get_tensor, then by hand"),
        ]

    blocks = "a tc.Stacked of blocks" if STACKED else "a list of blocks"
    what = f"{size.layers} GPT-2-style layers of width {size.width}, into {blocks}"
    return Case(
        name="checkpoint_hf_sharded_rules",
        group="8. checkpoints",
        title=f"load a {size.label} sharded checkpoint in Hugging Face's layout ({what}) "
        "through key rules",
        entries=entries,
        sync=_block,
        modules=("safetensors",),
        target=Target(f"<= 1.0x {_BASELINE}", "max_ratio", 1.0, (_BASELINE,)),
        plan=one_call_per_sample,
        extra=lambda: measure_memory(size, folder),
        note="Wall clock, one load per sample, into an abstract model (`jax.eval_shape`); "
        "the shards are written once by the `safetensors` package, untimed.",
    )
