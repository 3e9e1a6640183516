"""Where a scanned transformer step loses to the unrolled one: `python -m benchmarks.scan_gap`.

A plain-JAX probe, no treeclass: one GPT-2-small training step (SGD, float32 parameters,
bfloat16 compute; 12 blocks of width 768, sequence 1024, batch 4) compiled and timed in
the variants that could close the gap between `lax.scan` over stacked blocks (what
`tc.Stacked`, equinox and `nnx.scan` do) and a Python loop over the blocks: the stack cast
to bfloat16 once before the loop, `jax.checkpoint` of each block with and without a
policy, and scan's `_split_transpose`. Each variant prints its compile time, the median
and fastest of `--steps` steps, and XLA's temporary memory. The figures in
docs/performance.md ("Where the scanned step loses to the unrolled one") come from a TPU
v5e run of this probe (2026-12-06). `--small` runs a tiny model (for a CPU, and the tests); names
given on the command line pick variants.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["VARIANTS", "Shape", "measure", "main"]

_COMPUTE = jnp.bfloat16


@dataclass(frozen=True)
class Shape:
    """The decoder and its batch: blocks, width, heads, sequence, batch, vocabulary."""

    blocks: int = 12
    width: int = 768
    heads: int = 12
    seq: int = 1024
    batch: int = 4
    vocab: int = 50304


SMALL = Shape(2, 64, 4, 32, 2, 256)

# name -> (unrolled, rematerialisation policy ("full": save nothing), cast once, split)
_DOTS = jax.checkpoint_policies.dots_with_no_batch_dims_saveable
VARIANTS: dict[str, tuple[bool, Any, bool, bool]] = {
    "unrolled": (True, None, False, False),
    "scan": (False, None, False, False),
    "scan_cast_once": (False, None, True, False),
    "scan_split_transpose": (False, None, False, True),
    "scan_remat_full": (False, "full", False, False),
    "scan_remat_dots": (False, _DOTS, False, False),
    "scan_cast_once_remat_dots": (False, _DOTS, True, False),
    "unrolled_remat_dots": (True, _DOTS, False, False),
}


def _params(shape: Shape) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    n, d = shape.blocks, shape.width

    def normal(*dims: int, scale: float = 0.02) -> Any:
        return jnp.asarray(rng.standard_normal(dims, dtype=np.float32) * scale)

    blocks = {
        "ln1": jnp.ones((n, d)),
        "qkv": normal(n, d, 3 * d),
        "proj": normal(n, d, d),
        "ln2": jnp.ones((n, d)),
        "up": normal(n, d, 4 * d),
        "down": normal(n, 4 * d, d),
    }
    head = {"wte": normal(shape.vocab, d), "wpe": normal(shape.seq, d), "ln_f": jnp.ones(d)}
    return {**head, "blocks": blocks}


def _norm(x: Any, scale: Any) -> Any:
    x = x.astype(jnp.float32)
    x = x - x.mean(-1, keepdims=True)
    return (x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + 1e-5) * scale).astype(_COMPUTE)


def _block(p: dict[str, Any], x: Any, heads: int) -> Any:
    b, t, d = x.shape
    w = {k: v.astype(_COMPUTE) for k, v in p.items()}
    q, k, v = jnp.split(_norm(x, p["ln1"]) @ w["qkv"], 3, axis=-1)
    q, k, v = (z.reshape(b, t, heads, d // heads) for z in (q, k, v))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / np.sqrt(d // heads)
    causal = jnp.tril(jnp.ones((t, t), bool))
    weights = jax.nn.softmax(jnp.where(causal, scores, -1e9), -1).astype(_COMPUTE)
    x = x + jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(b, t, d) @ w["proj"]
    return x + jax.nn.gelu(_norm(x, p["ln2"]) @ w["up"]) @ w["down"]


def _loss(shape: Shape, variant: str) -> Callable[[Any, Any], Any]:
    unrolled, policy, cast_once, split = VARIANTS[variant]

    def block(p: Any, x: Any) -> Any:
        return _block(p, x, shape.heads)

    if policy is not None:
        block = jax.checkpoint(block, policy=None if policy == "full" else policy)

    def loss(params: Any, tokens: Any) -> Any:
        x = (params["wte"][tokens[:, :-1]] + params["wpe"]).astype(_COMPUTE)
        blocks = params["blocks"]
        if cast_once:  # the matrices once, outside the loop (the norms' scales stay f32)
            blocks = {k: v.astype(_COMPUTE) if v.ndim == 3 else v for k, v in blocks.items()}
        if unrolled:
            for i in range(shape.blocks):
                x = block({k: v[i] for k, v in blocks.items()}, x)
        else:
            extra = {"_split_transpose": True} if split else {}
            x = jax.lax.scan(lambda h, p: (block(p, h), None), x, blocks, **extra)[0]
        logits = (_norm(x, params["ln_f"]) @ params["wte"].astype(_COMPUTE).T).astype(jnp.float32)
        picked = jnp.take_along_axis(logits, tokens[:, 1:, None], -1)[..., 0]
        return jnp.mean(jax.nn.logsumexp(logits, -1) - picked)

    return loss


def measure(shape: Shape, variant: str, steps: int = 10) -> dict[str, Any]:
    """Compile one SGD step of `variant` and time `steps` steps after two warm-up steps."""
    loss = _loss(shape, variant)

    def step(params: Any, tokens: Any) -> Any:
        value, grads = jax.value_and_grad(loss)(params, tokens)
        return jax.tree.map(lambda p, g: p - 1e-3 * g, params, grads), value

    params = _params(shape)
    rng = np.random.default_rng(1)
    tokens = jnp.asarray(rng.integers(0, shape.vocab, (shape.batch, shape.seq + 1), np.int32))
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
        "step_ms_median": round(1e3 * float(np.median(times)), 3),
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
    shape = SMALL if args.small else Shape()
    results = [measure(shape, name, args.steps) for name in args.variants or VARIANTS]
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
