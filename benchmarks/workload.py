"""A real workload: steps per second of a training loop whose compute dominates.

Every other case times the tree layer on a tiny model, where it is most of the cost.
This one asks what it costs a user whose step does real work: an MLP of `depth` layers
of `f32[width, width]` (ReLU between, mean squared error), trained with `optax.adam`
on synthetic batches of `batch` rows, each implementation in its own idiom:

- treeclass, plain dicts and pytreeclass: `jax.jit` of `jax.value_and_grad` plus
  `optax.apply_updates`;
- equinox: `eqx.filter_jit`, `eqx.filter_value_and_grad`, `eqx.apply_updates`;
- flax.nnx: `nnx.jit`, `nnx.value_and_grad` and `nnx.Optimizer`, as its guides do.

A sample is a loop of `steps` steps that waits only for the last loss, as a training
loop does (on a GPU the host queues steps ahead of the device). All implementations
start from the same arrays and see the same batches; their first losses must agree.
The defaults (width 512, batch 256) make one step tens of milliseconds on a 2-core CPU;
on a GPU raise them (`--workload-width 4096 --workload-batch 4096`) so that compute
dominates there too.
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

from .cases import FLOOR, Case, Entry, Target
from .peers import get_kit, import_peer
from .timing import Plan

__all__ = ["WorkloadSize", "workload_case"]

_BATCHES = 4


@dataclass(frozen=True)
class WorkloadSize:
    """The MLP (`depth` layers of `width`), the batch rows, and steps per timed sample."""

    width: int = 512
    depth: int = 4
    batch: int = 256
    steps: int = 10


@functools.cache
def _arrays(size: WorkloadSize) -> tuple[list[tuple[Any, Any]], list[tuple[Any, Any]]]:
    rng = np.random.default_rng(512)
    scale = np.float32(np.sqrt(2.0 / size.width))
    layers = [
        (
            jnp.asarray(rng.standard_normal((size.width, size.width), dtype=np.float32) * scale),
            jnp.zeros((size.width,), jnp.float32),
        )
        for _ in range(size.depth)
    ]
    batches = [
        (
            jnp.asarray(rng.standard_normal((size.batch, size.width), dtype=np.float32)),
            jnp.asarray(rng.standard_normal((size.batch, size.width), dtype=np.float32)),
        )
        for _ in range(_BATCHES)
    ]
    return layers, batches


def _loss(layers: Any, x: Any, y: Any, item: bool) -> Any:
    *hidden, last = layers
    for layer in hidden:
        w, b = (layer["weight"], layer["bias"]) if item else (layer.weight, layer.bias)
        x = jax.nn.relu(x @ w + b)
    w, b = (last["weight"], last["bias"]) if item else (last.weight, last.bias)
    return jnp.mean((x @ w + b - y) ** 2)


def _loop(
    step: Callable[..., Any], state: list[Any], batches: list[Any], steps: int
) -> Callable[[], Any]:
    """A zero-argument function running `steps` steps; the state lives in `state`."""
    turn = [0]

    def run() -> Any:
        loss = None
        for _ in range(steps):
            x, y = batches[turn[0] % len(batches)]
            turn[0] += 1
            *new_state, loss = step(*state, x, y)
            state[:] = new_state
        return loss

    return run


def _jax_jit(kit_name: str, size: WorkloadSize) -> Callable[[], Any]:
    import optax

    kit = get_kit(kit_name)
    layers, batches = _arrays(size)
    model = kit.mlp([kit.linear(w, b) for w, b in layers])
    item = kit.style == "item"
    optim = optax.adam(1e-3)

    @jax.jit
    def step(model: Any, opt_state: Any, x: Any, y: Any) -> Any:
        loss, grads = jax.value_and_grad(
            lambda m: _loss(m["layers"] if item else m.layers, x, y, item)
        )(model)
        updates, opt_state = optim.update(grads, opt_state, model)
        return optax.apply_updates(model, updates), opt_state, loss

    return _loop(step, [model, optim.init(model)], batches, size.steps)


def _equinox(size: WorkloadSize) -> Callable[[], Any]:
    import equinox as eqx
    import optax

    kit = get_kit("equinox")
    layers, batches = _arrays(size)
    model = kit.mlp([kit.linear(w, b) for w, b in layers])
    optim = optax.adam(1e-3)

    @eqx.filter_jit
    def step(model: Any, opt_state: Any, x: Any, y: Any) -> Any:
        loss, grads = eqx.filter_value_and_grad(lambda m: _loss(m.layers, x, y, False))(model)
        updates, opt_state = optim.update(grads, opt_state, eqx.filter(model, eqx.is_array))
        return eqx.apply_updates(model, updates), opt_state, loss

    return _loop(step, [model, optim.init(eqx.filter(model, eqx.is_array))], batches, size.steps)


def _nnx(size: WorkloadSize) -> Callable[[], Any]:
    nnx = import_peer("flax.nnx")
    import optax

    class Linear(nnx.Module):
        def __init__(self, weight: Any, bias: Any):
            self.weight, self.bias = nnx.Param(weight), nnx.Param(bias)

    class MLP(nnx.Module):
        def __init__(self, layers: list[Linear]):
            self.layers = nnx.List(layers)

    layers, batches = _arrays(size)
    model = MLP([Linear(w, b) for w, b in layers])
    optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)

    @nnx.jit
    def step(model: Any, optimizer: Any, x: Any, y: Any) -> Any:
        def loss_fn(model: Any) -> Any:
            return _loss(
                [_Layer(layer.weight[...], layer.bias[...]) for layer in model.layers], x, y, False
            )

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    def nnx_step(model: Any, optimizer: Any, x: Any, y: Any) -> Any:
        # nnx updates the model in place: the loop's state stays the same two objects
        return model, optimizer, step(model, optimizer, x, y)

    return _loop(nnx_step, [model, optimizer], batches, size.steps)


@dataclass
class _Layer:
    weight: Any
    bias: Any


def _block_array(result: Any) -> Any:
    return result.block_until_ready()


def workload_case(size: WorkloadSize) -> Case:
    """The training-loop case (see the module docstring) at `size`."""

    def entries() -> list[Entry]:
        return [
            Entry("treeclass", "treeclass", lambda: _jax_jit("treeclass", size), note="`jax.jit`"),
            Entry(FLOOR, "floor", lambda: _jax_jit("dict", size), note="`jax.jit`"),
            Entry("equinox (filter_jit)", "peer", lambda: _equinox(size), note="`eqx.filter_jit`"),
            Entry("flax.nnx", "peer", lambda: _nnx(size), note="`nnx.jit` + `nnx.Optimizer`"),
            Entry("pytreeclass", "peer", lambda: _jax_jit("pytreeclass", size), note="`jax.jit`"),
        ]

    def plan(base: Plan) -> Plan:
        # one loop per sample on the wall clock (XLA's CPU matmuls use every core, which a
        # process's CPU time would count several times over)
        return dataclasses.replace(
            base,
            rounds=min(base.rounds, 9),
            calibrate=False,
            clock="wall",
            warmup=min(base.warmup, 1),
        )

    return Case(
        name="workload_training_loop",
        group="0. real workload",
        title=f"training loop: {size.steps} adam steps of a {size.depth}-layer MLP of width "
        f"{size.width}, batch {size.batch}",
        entries=entries,
        sync=_block_array,
        modules=("optax",),
        target=Target("<= 1.02x vs dict (steps/s within 2%)", "max_ratio", 1.02, (FLOOR,)),
        plan=plan,
        rate=("steps/s", size.steps),
        note="Each sample is a loop of steps that waits for the last loss only; the rate "
        "column is steps per second.",
    )
