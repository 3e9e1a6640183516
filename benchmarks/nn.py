"""Layers: the workload's training loop with a model built from `treeclass.nn`.

The same MLP as the real-workload case (`depth` layers of `f32[width, width]`, ReLU
between, mean squared error, `optax.adam`), built three ways from the same arrays:

- **treeclass**: `tc.nn.MLP`, whose `Linear` layers store `weight` as `[out, in]`
  (PyTorch's layout) and contract the input's last axis with the weight's;
- **treeclass, hand-written**: the benchmark suite's own treeclass `Linear` (`x @ w + b`,
  `w` as `[in, out]`), exactly as the workload case runs it;
- **dict** (the floor): the same loop over plain dicts.

The question is whether the layers cost anything over writing them by hand: the target
is the workload's, steps per second within 2% of the hand-written model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from .cases import FLOOR, Case, Entry, Sizes, Target
from .timing import Plan
from .workload import WorkloadSize, _arrays, _jax_jit, _loop

__all__ = ["nn_size", "nn_case", "nn_cases", "small_step_note"]

_HAND_WRITTEN = "treeclass, hand-written"


def nn_size(sizes: Sizes) -> WorkloadSize:
    """The loop's size for the run's `sizes`: the workload's defaults in a full run
    (width 512, batch 256, 4 layers, 10 steps), a tiny model in smoke mode."""
    small = sizes.block_width < 64
    return WorkloadSize(
        width=2 * sizes.block_width,
        depth=4,
        batch=4 * sizes.block_batch,
        steps=2 if small else 10,
    )


def _layers_loop(size: WorkloadSize) -> Callable[[], Any]:
    import optax

    import treeclass as tc

    layers, batches = _arrays(size)
    model = tc.nn.MLP(size.width, size.width, size.width, size.depth - 1, key=jax.random.key(0))
    model = model.replace(
        layers=tuple(
            layer.replace(weight=jnp.asarray(w.T), bias=b)
            for layer, (w, b) in zip(model.layers, layers, strict=True)
        )
    )
    optim = optax.adam(1e-3)

    @jax.jit
    def step(model: Any, opt_state: Any, x: Any, y: Any) -> Any:
        loss, grads = jax.value_and_grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)
        updates, opt_state = optim.update(grads, opt_state, model)
        return optax.apply_updates(model, updates), opt_state, loss

    return _loop(step, [model, optim.init(model)], batches, size.steps)


def nn_case(size: WorkloadSize) -> Case:
    """The training loop of a `treeclass.nn` model against the hand-written one."""

    def entries() -> list[Entry]:
        return [
            Entry("treeclass", "treeclass", lambda: _layers_loop(size), note="`tc.nn.MLP` layers"),
            Entry(
                _HAND_WRITTEN,
                "baseline",
                lambda: _jax_jit("treeclass", size),
                note="the workload's model",
            ),
            Entry(FLOOR, "floor", lambda: _jax_jit("dict", size), note="`jax.jit`"),
        ]

    def plan(base: Plan) -> Plan:
        # as the workload: one loop per sample on the wall clock (XLA uses every core)
        return dataclasses.replace(
            base,
            rounds=min(base.rounds, 9),
            calibrate=False,
            clock="wall",
            warmup=min(base.warmup, 1),
        )

    return Case(
        name="nn_training_loop",
        group="0. real workload",
        title=f"training loop with `treeclass.nn` layers: {size.steps} adam steps of a "
        f"{size.depth}-layer MLP of width {size.width}, batch {size.batch}",
        entries=entries,
        sync=lambda loss: loss.block_until_ready(),
        modules=("optax",),
        target=Target(
            "<= 1.02x vs hand-written layers (steps/s within 2%)",
            "max_ratio",
            1.02,
            (_HAND_WRITTEN,),
        ),
        plan=plan,
        rate=("steps/s", size.steps),
        note="The same arrays and batches as the hand-written model; the nn model stores "
        "each weight transposed (`[out, in]`), so the first losses agree to float tolerance. "
        + small_step_note(size),
    )


def small_step_note(size: WorkloadSize) -> str:
    """What a step of this MLP times: its model FLOPs (6 per parameter per batch row, the
    forward and backward matrix products), and that on an accelerator such a step is
    dispatch, not compute.

    ```python
    from benchmarks.nn import small_step_note
    from benchmarks.workload import WorkloadSize

    assert "about 1.6 GFLOP" in small_step_note(WorkloadSize(512, 4, 256, 10))
    ```
    """
    flops = 6 * size.depth * size.width**2 * size.batch
    return (
        f"A step is about {flops / 1e9:.1f} GFLOP (6 x parameters x batch rows): an "
        "accelerator does that in a small part of the step's measured time (0.6 ms a step "
        "on the TPU v5e, some 1% of its peak), so there the loop times dispatch and the "
        "host's Python, one jitted call per step, not compute; `workload_training_loop` "
        "and `transformer_training_loop` are the compute-bound cases."
    )


def nn_cases(sizes: Sizes) -> list[Case]:
    """The layers case at the run's sizes.

    ```python
    from benchmarks.cases import SMOKE_SIZES
    from benchmarks.nn import nn_cases

    assert [c.name for c in nn_cases(SMOKE_SIZES)] == ["nn_training_loop"]
    ```
    """
    return [nn_case(nn_size(sizes))]
