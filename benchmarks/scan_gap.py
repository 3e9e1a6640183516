"""Where a scanned transformer step loses to the unrolled one: `python -m benchmarks.scan_gap`.

A plain-JAX probe, no treeclass: one GPT-2-small training step (SGD, float32 parameters,
bfloat16 compute; 12 blocks of width 768, sequence 1024, batch 4) compiled and timed in
the variants that could close the gap between `lax.scan` over stacked blocks (what
`tc.Stacked`, equinox and `nnx.scan` do) and a Python loop over the blocks: the stack cast
to bfloat16 once before the loop, `jax.checkpoint` of each block with and without a
policy, and scan's `_split_transpose`. Each variant prints its compile time, the median
and fastest of `--steps` steps, and XLA's temporary memory. The model and
its maths are the suite's own (`benchmarks/transformer.py`: the GPT training loop's
block, embedding and head). The figures in docs/performance.md ("Where the scanned step
loses to the unrolled one") come from a TPU v5e run of these variants on that shape
(2026-12-06). `--small` runs a tiny model (for a CPU, and the tests); names
given on the command line pick variants.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import jax

from .transformer import (
    _BLOCK_KEYS,
    _COMPUTE,
    GPTSize,
    _arrays,
    _batches,
    _block,
    _embed,
    _fresh,
    _head_loss,
    gpt_size,
)

__all__ = ["VARIANTS", "measure", "main"]

# the suite's own GPT step (benchmarks/transformer.py): GPT-2 small, batch 4; or tiny
FULL = gpt_size("full", "tpu")
SMALL = gpt_size("smoke", "cpu")

# name -> (unrolled, rematerialisation policy ("full": save nothing), cast once, split)
_POLICIES = jax.checkpoint_policies
_DOTS = _POLICIES.dots_with_no_batch_dims_saveable
# the block's named products (transformer.py's `_block`): the qkv and up projections and
# the attention output; the softmax and the norms are recomputed
_NAMED = _POLICIES.save_only_these_names("qkv", "attended", "up")
_OFFLOAD = _POLICIES.offload_dot_with_no_batch_dims("device", "pinned_host")
VARIANTS: dict[str, tuple[bool, Any, bool, bool]] = {
    "unrolled": (True, None, False, False),
    "scan": (False, None, False, False),
    "scan_cast_once": (False, None, True, False),
    "scan_split_transpose": (False, None, False, True),
    "scan_remat_full": (False, "full", False, False),
    "scan_remat_dots": (False, _DOTS, False, False),
    "scan_cast_once_remat_dots": (False, _DOTS, True, False),
    "unrolled_remat_dots": (True, _DOTS, False, False),
    "scan_remat_all_dots": (False, _POLICIES.checkpoint_dots, False, False),
    "scan_remat_named": (False, _NAMED, False, False),
    "scan_remat_offload_dots": (False, _OFFLOAD, False, False),
}


def _params(size: GPTSize) -> dict[str, Any]:
    a = _arrays(size)
    blocks = {k: _fresh(a[k]) for k in _BLOCK_KEYS}
    return {
        "wte": _fresh(a["wte"]),
        "wpe": _fresh(a["wpe"]),
        "ln_f": _fresh(a["ln_f"]),
        "blocks": blocks,
    }


def _loss(size: GPTSize, variant: str) -> Callable[[Any, Any], Any]:
    unrolled, policy, cast_once, split = VARIANTS[variant]

    def block(p: Any, x: Any) -> Any:
        return _block(p, x, size.heads)

    if policy is not None:
        block = jax.checkpoint(block, policy=None if policy == "full" else policy)

    def loss(params: Any, tokens: Any) -> Any:
        x = _embed(params["wte"], params["wpe"], tokens[:, :-1])
        blocks = params["blocks"]
        if cast_once:  # the matrices once, outside the loop (the norms' scales stay f32)
            blocks = {k: v.astype(_COMPUTE) if v.ndim == 3 else v for k, v in blocks.items()}
        if unrolled:
            for i in range(size.blocks):
                x = block({k: v[i] for k, v in blocks.items()}, x)
        else:
            extra = {"_split_transpose": True} if split else {}
            x = jax.lax.scan(lambda h, p: (block(p, h), None), x, blocks, **extra)[0]
        return _head_loss(params["wte"], params["ln_f"], x, tokens[:, 1:])

    return loss


def measure(size: GPTSize, variant: str, steps: int = 10) -> dict[str, Any]:
    """Compile one SGD step of `variant` and time `steps` steps after two warm-up steps."""
    loss = _loss(size, variant)

    def step(params: Any, tokens: Any) -> Any:
        value, grads = jax.value_and_grad(loss)(params, tokens)
        return jax.tree.map(lambda p, g: p - 1e-3 * g, params, grads), value

    params, tokens = _params(size), _batches(size)[0]
    start = time.perf_counter()
    compiled = jax.jit(step, donate_argnums=0).lower(params, tokens).compile()
    compile_s = time.perf_counter() - start
    memory = compiled.memory_analysis()
    times, value = [], None
    for i in range(steps + 2):
        start = time.perf_counter()
        params, value = compiled(params, tokens)
        value.block_until_ready()
        if i >= 2:
            times.append(time.perf_counter() - start)
    return {
        "variant": variant,
        "compile_s": round(compile_s, 3),
        "step_ms_median": round(1e3 * statistics.median(times), 3),
        "step_ms_min": round(1e3 * min(times), 3),
        "temp_bytes": getattr(memory, "temp_size_in_bytes", None),
        "loss": float(value),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scan_gap", description=__doc__)
    parser.add_argument("variants", nargs="*", help=f"any of {', '.join(VARIANTS)} (all)")
    parser.add_argument("--small", action="store_true", help="a tiny model (CPU, tests)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps a variant")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    size = SMALL if args.small else FULL
    results = [measure(size, name, args.steps) for name in args.variants or VARIANTS]
    base = next((r for r in results if r["variant"] == "unrolled"), None)
    for r in results:
        ratio = f"{r['step_ms_median'] / base['step_ms_median']:.2f}x" if base else "n/a"
        print(
            f"{r['variant']:<28} step {r['step_ms_median']:9.2f} ms ({ratio} of unrolled), "
            f"compile {r['compile_s']:7.2f} s, temp {r['temp_bytes']} B",
            flush=True,
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump({"backend": jax.default_backend(), "results": results}, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
