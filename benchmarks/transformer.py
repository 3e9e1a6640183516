"""A GPT-style decoder trained with adam: where compute dominates, what does the tree cost?

A decoder of `blocks` pre-norm blocks (causal multi-head self-attention, a 4x MLP with
GELU, residuals), learned token and position embeddings, the unembedding tied to the
token embedding, next-token cross entropy. Parameters and adam's moments are float32;
the forward and backward passes compute in bfloat16 (every parameter is cast on use,
softmax and the loss in float32), as mixed-precision training does. Each implementation
builds the same model from the same arrays, sees the same batches, and its first loss
must agree with the others':

- **treeclass** (`tc.Stacked`): the model a user of `treeclass.nn` writes: an `nn.Embed`
  (tied: its `attend` gives the logits), an `nn.PositionEmbedding`, `nn.DecoderBlock`s
  configured as GPT-2's (`norm="layer"`, `gated=False`, `activation=jax.nn.gelu`, no
  biases: the norms' are set to `None` with `.at`) stacked with `tc.Stacked.from_blocks`
  and called, one `lax.scan`, and a final `nn.LayerNorm`; every layer `dtype=bfloat16`;
- **treeclass, unrolled**: the same model with its blocks in a tuple, a Python loop;
- **plain JAX** (the floor): a dict of stacked arrays and a hand-written `lax.scan`;
- **equinox**: one block module holding stacked arrays, `eqx.partition` and `lax.scan`
  with `eqx.combine` in the body, `eqx.filter_jit` and `eqx.filter_value_and_grad`;
- **flax.nnx**: the same stacked block under `nnx.scan`, the split state trained by
  `jax.jit` (as the stacked-blocks case does).

The peers' and the floor's block is one hand-written function (`_block`: a fused `qkv`
matrix `[in, out]`, the softmax written out); the `tc.nn` model holds the same numbers
in its layers' layouts (separate `q_proj`, `k_proj`, `v_proj`, `[out, in]`) and attends
with `jax.nn.dot_product_attention`. It is built under one `jax.jit`: created with a key,
as a user creates it, then each leaf set from the shared arrays through `.at` (the random
initialisation they replace is never computed).

Every step is `optax.adam` on all parameters, jitted with the old state donated (so one
copy of the parameters and moments lives per implementation). A sample is a loop of
`steps` steps that waits only for the last loss, as a training loop does.

The rate columns are steps, tokens (`batch * seq` a step) and model FLOP utilisation: the
model's FLOPs per step over the time, against the device's peak. Model FLOPs follow the
usual count for a decoder (PaLM, Chowdhery et al. 2022, appendix B): `6 * N` per token
for the `N` parameters of the matrix products (the blocks' and the tied unembedding,
not the embedding lookups), plus `12 * blocks * seq * width` per token for attention
(forward and backward, the causal half not discounted). Recomputation is not counted.
The peak is known for TPU v5e (197 TFLOP/s bf16 per chip); elsewhere MFU reads n/a
unless `--peak-tflops` states a nominal figure.

Sizes: on an accelerator, GPT-2 small (12 blocks of width 768, 12 heads, sequence 1024,
vocabulary 50,304) at batch 4 (five implementations hold their parameters and adam
moments on one 16 GB chip at once; `--transformer-batch` changes it); on the CPU a small
decoder that keeps the case to seconds; `--quick` times fewer steps; `--smoke` a toy.
`transformer_compute_bound` (an accelerator only, not in `--smoke`) is the MFU case:
width 1024, 8 heads of 128, sequence 512, batch 16, three rows (see `compute_bound_case`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from .cases import Case, Entry, Target
from .peers import import_peer
from .timing import Plan

__all__ = [
    "PEAK_FLOPS",
    "GPTSize",
    "gpt_size",
    "peak_flops",
    "transformer_case",
    "compute_bound_case",
]

_GROUP = "0. real workload"
_STACKED = "treeclass"
_UNROLLED = "treeclass, unrolled"
_FLOOR = "plain JAX (lax.scan)"
_EQUINOX = "equinox (filter_jit, scan)"
_NNX = "flax.nnx (nnx.scan)"
_COMPUTE = jnp.bfloat16
_BATCHES = 2

# device kind (as `jax.devices()[0].device_kind` names it) -> (bf16 FLOP/s, source)
PEAK_FLOPS: dict[str, tuple[float, str]] = {
    "TPU v5 lite": (197e12, "Cloud TPU v5e documentation, peak bf16 compute per chip"),
    "TPU v5e": (197e12, "Cloud TPU v5e documentation, peak bf16 compute per chip"),
}


@dataclass(frozen=True)
class GPTSize:
    """The decoder (`blocks` of `width`, `heads` heads), its data and steps per sample."""

    blocks: int
    width: int
    heads: int
    seq: int
    batch: int
    vocab: int
    steps: int

    @property
    def tokens(self) -> int:
        """Tokens in one step's batch."""
        return self.batch * self.seq

    @property
    def matmul_params(self) -> int:
        """Parameters of the matrix products: 12 width^2 a block and the unembedding."""
        return self.blocks * 12 * self.width**2 + self.vocab * self.width

    @property
    def flops_per_step(self) -> float:
        """Model FLOPs of one training step (see the module docstring)."""
        per_token = 6 * self.matmul_params + 12 * self.blocks * self.seq * self.width
        return float(per_token * self.tokens)


# preset -> (accelerator size, CPU size)
_PRESETS: dict[str, tuple[GPTSize, GPTSize]] = {
    "full": (GPTSize(12, 768, 12, 1024, 4, 50304, 10), GPTSize(2, 128, 4, 128, 4, 1024, 2)),
    "quick": (GPTSize(12, 768, 12, 1024, 4, 50304, 3), GPTSize(2, 128, 4, 128, 4, 1024, 1)),
    "smoke": (GPTSize(2, 16, 2, 8, 2, 64, 1), GPTSize(2, 16, 2, 8, 2, 64, 1)),
}


# the compute-bound size, for an accelerator only: wider than GPT-2 small, 8,192 tokens a
# step (about 10.6 TFLOP), heads of 128 (the TPU's matrix unit is 128 wide: in a plain-JAX
# probe on a TPU v5e 16 heads of 64 stepped at 43% MFU where 8 of 128 gave 53%; the `tc.nn`
# model gave 50% stacked, 63% unrolled). Three implementations' parameters and adam
# moments (2.4 GB each) and one step's temporaries (6.5 GB, as XLA plans them) fit the
# chip's 15.7 GiB together; a scan that saves every intermediate (no rematerialisation)
# would need 11-16 GB on its own
COMPUTE_BOUND = GPTSize(12, 1024, 8, 512, 16, 50304, 5)
ACCELERATORS = ("tpu", "gpu")


def gpt_size(preset: str, backend: str, batch: int | None = None) -> GPTSize:
    """The decoder of `preset` (`"full"`, `"quick"` or `"smoke"`) for `backend`, with
    `batch` rows a step when given.

    ```python
    from benchmarks.transformer import gpt_size

    assert gpt_size("full", "tpu").width == 768
    assert gpt_size("full", "cpu").blocks < 12
    ```
    """
    accelerator, cpu = _PRESETS[preset]
    size = cpu if backend == "cpu" else accelerator
    return dataclasses.replace(size, batch=batch) if batch else size


def peak_flops(device_kind: str, nominal_tflops: float | None = None) -> tuple[float, str] | None:
    """The peak FLOP/s MFU is taken against, with where the figure comes from, or `None`.

    A stated `nominal_tflops` wins (it says so); else the table `PEAK_FLOPS`.
    """
    if nominal_tflops:
        return nominal_tflops * 1e12, "stated with --peak-tflops (nominal)"
    return PEAK_FLOPS.get(device_kind)


# -- the shared arrays and the maths every implementation uses --------------------------------


_BLOCK_KEYS = ("ln1", "qkv", "proj", "ln2", "up", "down")


@functools.cache
def _arrays(size: GPTSize) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(size.blocks * 31 + size.width)
    n, d, std = size.blocks, size.width, 0.02
    out_std = std / np.sqrt(2 * n)

    def normal(shape: tuple[int, ...], scale: float) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * scale).astype(np.float32)

    return {
        "wte": normal((size.vocab, d), std),
        "wpe": normal((size.seq, d), std / 2),
        "ln_f": np.ones((d,), np.float32),
        "ln1": np.ones((n, d), np.float32),
        "qkv": normal((n, d, 3 * d), std),
        "proj": normal((n, d, d), out_std),
        "ln2": np.ones((n, d), np.float32),
        "up": normal((n, d, 4 * d), std),
        "down": normal((n, 4 * d, d), out_std),
    }


@functools.cache
def _batches(size: GPTSize) -> tuple[Any, ...]:
    rng = np.random.default_rng(1024)
    return tuple(
        jnp.asarray(rng.integers(0, size.vocab, (size.batch, size.seq + 1), dtype=np.int32))
        for _ in range(_BATCHES)
    )


def _fresh(array: np.ndarray) -> Any:
    """A device copy of its own (the steps donate their inputs)."""
    return jnp.array(array, copy=True)


def _norm(x: Any, scale: Any) -> Any:
    x32 = x.astype(jnp.float32)
    x32 = x32 - jnp.mean(x32, axis=-1, keepdims=True)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-5)
    return (x32 * scale).astype(_COMPUTE)


def _block(p: dict[str, Any], x: Any, heads: int) -> Any:
    """One pre-norm block on `x` of shape `[batch, seq, width]` (bf16)."""
    b, t, d = x.shape
    c = {k: v.astype(_COMPUTE) for k, v in p.items()}
    qkv = checkpoint_name(_norm(x, p["ln1"]) @ c["qkv"], "qkv")
    q, k, v = jnp.split(qkv, 3, axis=-1)
    q, k, v = (z.reshape(b, t, heads, d // heads) for z in (q, k, v))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / np.sqrt(d // heads)
    causal = jnp.tril(jnp.ones((t, t), bool))
    weights = jax.nn.softmax(jnp.where(causal, scores, -1e9), axis=-1).astype(_COMPUTE)
    attended = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(b, t, d)
    x = x + checkpoint_name(attended, "attended") @ c["proj"]
    return x + jax.nn.gelu(checkpoint_name(_norm(x, p["ln2"]) @ c["up"], "up")) @ c["down"]


def _embed(wte: Any, wpe: Any, tokens: Any) -> Any:
    return (wte[tokens] + wpe[: tokens.shape[1]]).astype(_COMPUTE)


def _head_loss(wte: Any, ln_f: Any, x: Any, targets: Any) -> Any:
    return _cross_entropy(_norm(x, ln_f) @ wte.astype(_COMPUTE).T, targets)


def _cross_entropy(logits: Any, targets: Any) -> Any:
    """The mean next-token cross entropy of bf16 `logits`, in float32."""
    logits = logits.astype(jnp.float32)
    picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - picked)


def _scan_blocks(stacked: dict[str, Any], x: Any, heads: int, remat: Any = None) -> Any:
    def body(x: Any, p: Any) -> Any:
        return _block(p, x, heads), None

    if remat is not None:
        body = jax.checkpoint(body, policy=remat)
    return jax.lax.scan(body, x, stacked)[0]


# -- treeclass: the model a user of `treeclass.nn` writes ------------------------------------------


# the rematerialisation policy of the compute-bound case's stacked rows: each block's
# matrix products with the weights (no batch dimension) are saved for the backward pass,
# the rest (norms, attention scores and softmax, GELU) is recomputed
_REMAT = jax.checkpoint_policies.dots_with_no_batch_dims_saveable


@functools.cache
def _nn_classes() -> type:
    import treeclass as tc

    nn = tc.nn

    class GPT(nn.Layer):
        """GPT-2's decoder from `tc.nn` layers: a tied token embedding, learned
        positions, `nn.DecoderBlock`s (pre-norm LayerNorm, causal attention, a 4x GELU MLP,
        no biases), a final norm. Built with its blocks in a tuple; `stacked()` puts them
        in a `tc.Stacked`, which `loss` runs in one scan (with `remat`, a
        rematerialisation policy, each block rematerialised under it)."""

        wte: nn.Embed
        wpe: nn.PositionEmbedding
        blocks: Any  # a tuple of DecoderBlocks, or a tc.Stacked of them
        ln_f: nn.LayerNorm
        remat: Any = tc.field(default=None, static=True)

        def __init__(self, size: GPTSize, *, key: Any, remat: Any = None) -> None:
            d, bf16 = size.width, _COMPUTE
            k_wte, k_wpe, k_blocks = jax.random.split(key, 3)
            self.wte = nn.Embed(size.vocab, d, dtype=bf16, key=k_wte)
            self.wpe = nn.PositionEmbedding(size.seq, d, dtype=bf16, key=k_wpe)

            def block(k: Any) -> Any:
                made = nn.DecoderBlock(
                    d,
                    size.heads,
                    4 * d,
                    norm="layer",
                    gated=False,
                    activation=jax.nn.gelu,
                    dtype=bf16,
                    key=k,
                )
                return made.at[nn.LayerNorm]["bias"].set(None)  # no biases, as the floor

            self.blocks = tuple(block(k) for k in jax.random.split(k_blocks, size.blocks))
            self.ln_f = nn.LayerNorm(d, use_bias=False, dtype=bf16)
            self.remat = remat

        def stacked(self) -> Any:
            return self.replace(blocks=tc.Stacked.from_blocks(self.blocks))

        def loss(self, tokens: Any) -> Any:
            x = self.wpe(self.wte(tokens[:, :-1]))
            if isinstance(self.blocks, tuple):
                for block in self.blocks:
                    x = block(x)
            elif self.remat is None:
                x = self.blocks(x)  # one lax.scan over the blocks
            else:
                x = self.blocks.scan(lambda b, x: (b(x), None), x, remat=self.remat)[0]
            logits = self.wte.attend(self.ln_f(x))  # tied to the embedding
            return _cross_entropy(logits, tokens[:, 1:])

    return GPT


def _nn_block_leaves(a: dict[str, Any], i: int, d: int) -> list[tuple[tuple, Any]]:
    """Block `i`'s shared arrays by their path in a `DecoderBlock`: `Linear.weight` is
    `[out, in]` where the shared arrays are `[in, out]`, and `qkv` holds q, k and v side
    by side."""
    qkv = a["qkv"][i]
    return [
        (("input_layernorm", "weight"), a["ln1"][i]),
        (("self_attn", "q_proj", "weight"), qkv[:, :d].T),
        (("self_attn", "k_proj", "weight"), qkv[:, d : 2 * d].T),
        (("self_attn", "v_proj", "weight"), qkv[:, 2 * d :].T),
        (("self_attn", "o_proj", "weight"), a["proj"][i].T),
        (("post_attention_layernorm", "weight"), a["ln2"][i]),
        (("mlp", "up_proj", "weight"), a["up"][i].T),
        (("mlp", "down_proj", "weight"), a["down"][i].T),
    ]


def _set(model: Any, path: tuple, value: Any) -> Any:
    at = model.at
    for key in path:
        at = at[key]
    return at.set(value)


def _nn_model(size: GPTSize, unrolled: bool, remat: Any = None) -> Any:
    """The `tc.nn` GPT holding the shared arrays: built as a user builds it, each leaf set
    through `.at`, then stacked unless `unrolled`. All under one `jax.jit`, so the
    initialisation that the shared arrays replace is never computed (and the model's
    arrays are the jit's own outputs, free to donate)."""
    GPT = _nn_classes()

    def build(a: dict[str, Any]) -> Any:
        model = GPT(size, key=jax.random.key(0), remat=remat)
        for name in ("wte", "wpe", "ln_f"):
            model = _set(model, (name, "weight"), a[name])
        for i in range(size.blocks):
            for path, value in _nn_block_leaves(a, i, size.width):
                model = _set(model, ("blocks", i, *path), value)
        return model if unrolled else model.stacked()

    return jax.jit(build)(_arrays(size))


# -- the training loops -------------------------------------------------------------------------


def _loop(step: Callable[..., Any], state: list[Any], size: GPTSize) -> Callable[[], Any]:
    """A zero-argument function running `size.steps` steps; the state lives in `state`."""
    batches = _batches(size)
    turn = [0]

    def run() -> Any:
        loss = None
        for _ in range(size.steps):
            tokens = batches[turn[0] % len(batches)]
            turn[0] += 1
            *new_state, loss = step(*state, tokens)
            state[:] = new_state
        return loss

    return run


def _optax_loop(
    params: Any, loss_fn: Callable[[Any, Any], Any], size: GPTSize
) -> Callable[[], Any]:
    """`jax.jit` of `value_and_grad(loss_fn)` and adam, params and moments donated."""
    import optax

    optim = optax.adam(3e-4)

    def step(params: Any, opt_state: Any, tokens: Any) -> Any:
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
        updates, opt_state = optim.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return _loop(jax.jit(step, donate_argnums=(0, 1)), [params, optim.init(params)], size)


def _treeclass(size: GPTSize, unrolled: bool, remat: Any = None) -> Callable[[], Any]:
    return _optax_loop(_nn_model(size, unrolled, remat), lambda m, t: m.loss(t), size)


def _floor(size: GPTSize, remat: Any = None) -> Callable[[], Any]:
    a = _arrays(size)
    params = {k: _fresh(v) for k, v in a.items()}

    def loss(p: Any, tokens: Any) -> Any:
        x = _embed(p["wte"], p["wpe"], tokens[:, :-1])
        x = _scan_blocks({k: p[k] for k in _BLOCK_KEYS}, x, size.heads, remat)
        return _head_loss(p["wte"], p["ln_f"], x, tokens[:, 1:])

    return _optax_loop(params, loss, size)


def _equinox(size: GPTSize) -> Callable[[], Any]:
    eqx = import_peer("equinox")
    import optax

    class EqxBlock(eqx.Module):
        ln1: jax.Array
        qkv: jax.Array
        proj: jax.Array
        ln2: jax.Array
        up: jax.Array
        down: jax.Array
        heads: int = eqx.field(static=True)

        def __call__(self, x: Any) -> Any:
            return _block({k: getattr(self, k) for k in _BLOCK_KEYS}, x, self.heads)

    class EqxGPT(eqx.Module):
        wte: jax.Array
        wpe: jax.Array
        blocks: EqxBlock  # arrays stacked along a leading block axis
        ln_f: jax.Array

        def loss(self, tokens: Any) -> Any:
            x = _embed(self.wte, self.wpe, tokens[:, :-1])
            dynamic, static = eqx.partition(self.blocks, eqx.is_array)

            def body(x: Any, block: Any) -> Any:
                return eqx.combine(block, static)(x), None

            x = jax.lax.scan(body, x, dynamic)[0]
            return _head_loss(self.wte, self.ln_f, x, tokens[:, 1:])

    a = _arrays(size)
    blocks = EqxBlock(*(_fresh(a[k]) for k in _BLOCK_KEYS), heads=size.heads)
    model = EqxGPT(_fresh(a["wte"]), _fresh(a["wpe"]), blocks, _fresh(a["ln_f"]))
    optim = optax.adam(3e-4)

    @eqx.filter_jit(donate="all")
    def step(model: Any, opt_state: Any, tokens: Any) -> Any:
        loss, grads = eqx.filter_value_and_grad(lambda m: m.loss(tokens))(model)
        updates, opt_state = optim.update(grads, opt_state, eqx.filter(model, eqx.is_array))
        return eqx.apply_updates(model, updates), opt_state, loss

    return _loop(step, [model, optim.init(eqx.filter(model, eqx.is_array))], size)


def _nnx(size: GPTSize) -> Callable[[], Any]:
    nnx = import_peer("flax.nnx")

    class NnxBlock(nnx.Module):
        def __init__(self, arrays: dict[str, Any], heads: int):
            for key in _BLOCK_KEYS:
                setattr(self, key, nnx.Param(arrays[key]))
            self.heads = heads

        def __call__(self, x: Any) -> Any:
            return _block({k: getattr(self, k)[...] for k in _BLOCK_KEYS}, x, self.heads)

    class NnxGPT(nnx.Module):
        def __init__(self, arrays: dict[str, Any], heads: int):
            self.wte, self.wpe = nnx.Param(arrays["wte"]), nnx.Param(arrays["wpe"])
            self.ln_f = nnx.Param(arrays["ln_f"])
            self.blocks = NnxBlock({k: arrays[k] for k in _BLOCK_KEYS}, heads)

        def loss(self, tokens: Any) -> Any:
            @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
            def forward(x: Any, block: Any) -> Any:
                return block(x)

            x = _embed(self.wte[...], self.wpe[...], tokens[:, :-1])
            x = forward(x, self.blocks)
            return _head_loss(self.wte[...], self.ln_f[...], x, tokens[:, 1:])

    a = _arrays(size)
    graphdef, state = nnx.split(NnxGPT({k: _fresh(v) for k, v in a.items()}, size.heads))
    return _optax_loop(state, lambda s, t: nnx.merge(graphdef, s).loss(t), size)


# -- the case -----------------------------------------------------------------------------------


def transformer_case(size: GPTSize) -> Case:
    """The GPT training-loop case at `size` (see the module docstring)."""

    def entries() -> list[Entry]:
        return [
            Entry(
                _STACKED,
                "treeclass",
                lambda: _treeclass(size, unrolled=False),
                note="`tc.nn.DecoderBlock`s in a `tc.Stacked`",
            ),
            Entry(
                _UNROLLED,
                "baseline",
                lambda: _treeclass(size, unrolled=True),
                note="the same `tc.nn` blocks in a tuple, a Python loop",
            ),
            Entry(_FLOOR, "floor", lambda: _floor(size), note="dict of stacked arrays"),
            Entry(_EQUINOX, "peer", lambda: _equinox(size), note="`eqx.partition` + `lax.scan`"),
            Entry(_NNX, "peer", lambda: _nnx(size), note="`nnx.scan`, `jax.jit` of split state"),
        ]

    def plan(base: Plan) -> Plan:
        # one loop per sample on the wall clock: the device (or XLA's CPU threads) works
        return dataclasses.replace(
            base,
            rounds=min(base.rounds, 7),
            calibrate=False,
            clock="wall",
            warmup=min(base.warmup, 1),
            remeasures=min(base.remeasures, 1),
        )

    return Case(
        name="transformer_training_loop",
        group=_GROUP,
        title=f"GPT training loop: {size.steps} adam step(s) of {size.blocks} blocks of width "
        f"{size.width} ({size.heads} heads), sequence {size.seq}, batch {size.batch}, "
        f"vocabulary {size.vocab:,}, bf16 compute",
        entries=entries,
        sync=lambda loss: loss.block_until_ready(),
        modules=("optax",),
        target=Target("<= 1.02x vs plain JAX (steps/s within 2%)", "max_ratio", 1.02, (_FLOOR,)),
        rtol=2e-3,  # bf16: a scan and an unrolled loop fuse, so round, differently
        # the target pairs tc.Stacked with a scan as plain JAX writes it; every scanned
        # model may still step slower than the unrolled one: say so beside the verdict
        beside=(("tc.Stacked step / unrolled step", _STACKED, _UNROLLED),),
        plan=plan,
        rate=("steps/s", size.steps),
        work={"tokens": float(size.tokens * size.steps), "flops": size.flops_per_step * size.steps},
        note="Each sample is a loop of steps that waits for the last loss only. *tokens/s* "
        "counts batch x sequence per step; *MFU* is the model FLOPs per second (6 N per "
        "token for the N matrix-product parameters, plus 12 x blocks x sequence x width for "
        "attention) over the device's peak, given in the run's header.",
    )


def compute_bound_case(size: GPTSize = COMPUTE_BOUND) -> Case:
    """The GPT training loop at a size that keeps an accelerator busy, its MFU reported.

    Three rows, so that their parameters and adam moments fit one 16 GB chip together
    (the peers' rows are in `transformer_training_loop`): the `tc.nn` model stacked, each
    block rematerialised in the backward pass with only its matrix products with the
    weights saved (`jax.checkpoint_policies.dots_with_no_batch_dims_saveable` through
    `Stacked.scan(..., remat=...)`: a scan that saves everything needs more memory than
    the chip has beside the other rows, and steps slower); the same `tc.nn` blocks
    unrolled (nothing rematerialised: the fastest form); plain JAX's `lax.scan` under the
    same policy. No speed target: the figure is each row's MFU (the aim is half the
    chip's peak with stacked blocks) and, beside it, the stacked step against the
    unrolled one. Skipped off an accelerator, where the run would take minutes and say
    nothing about one.

    ```python
    from benchmarks.transformer import compute_bound_case

    case = compute_bound_case()
    assert case.backends == ("tpu", "gpu") and case.target is None
    ```
    """
    base = transformer_case(size)

    def entries() -> list[Entry]:
        return [
            Entry(
                _STACKED,
                "treeclass",
                lambda: _treeclass(size, unrolled=False, remat=_REMAT),
                note="`tc.nn.DecoderBlock`s in a `tc.Stacked`, "
                "`scan(..., remat=dots_with_no_batch_dims_saveable)`",
            ),
            Entry(
                _UNROLLED,
                "baseline",
                lambda: _treeclass(size, unrolled=True),
                note="the same `tc.nn` blocks in a tuple, nothing rematerialised",
            ),
            Entry(
                _FLOOR,
                "floor",
                lambda: _floor(size, remat=_REMAT),
                note="dict of stacked arrays, `jax.checkpoint` of the body, same policy",
            ),
        ]

    return dataclasses.replace(
        base,
        name="transformer_compute_bound",
        title=f"GPT training loop, compute-bound size: {size.steps} adam step(s) of "
        f"{size.blocks} blocks of width {size.width} ({size.heads} heads), sequence "
        f"{size.seq}, batch {size.batch}, vocabulary {size.vocab:,}, bf16 compute",
        entries=entries,
        modules=("optax",),
        target=None,
        backends=ACCELERATORS,
        note=base.note + " Sized to be compute-bound on an accelerator (about "
        f"{size.flops_per_step / 1e12:.1f} TFLOP a step): the MFU column is the figure; "
        "the aim is half the chip's peak with stacked blocks. The scanned rows "
        "rematerialise each block but for its matrix products with the weights; MFU does "
        "not count the recomputed work.",
    )
