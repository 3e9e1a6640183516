"""Per-leaf optimizers on an MLP: decay on weights only, a slower bias, a frozen layer.

A small MLP fits a synthetic regression task (`y = sin(x @ a) + 0.1 * x @ b`). Three
choices are made per leaf, each with one selection:

- weights train with `optax.adamw` (decoupled weight decay); biases train with
  `optax.adam` at a tenth of the learning rate, so only weights are decayed. The labels
  come from `tc.optim.labels(params, {"weight": params.at[Linear]["weight"], ...})`, and
  the whole optimizer is wrapped by `tc.optim.trainable(..., model)`, which trains the
  parameters only and keeps no optimizer state for frozen values;
- the first layer is frozen with `tc.freeze`: its arrays become pytree nodes without
  children, so `jax.grad`, `opt.init` and `opt.update` never see them; the label tree,
  built from the frozen model, has no label there either.

`main()` trains for a few hundred full-batch steps and returns the figures the tests
check: the loss falls, the frozen layer is bit-identical, and the first Adam step moves
every weight by the weight learning rate and every bias by the bias learning rate (Adam's
first step is `lr * sign(grad)`, up to its epsilon), which shows the two rates apart.

Halfway through, the model and the optimizer state are saved with `tc.save` and training
continues from `tc.load` into a freshly built model and optimizer state: the losses after
the checkpoint are those of the same steps run from the in-memory state, bit for bit.

Run it with `python docs/examples/mlp_per_leaf.py`.
"""

from __future__ import annotations

import os
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import optax

import treeclass as tc
import treeclass.optim

WEIGHT_LR = 1e-2
BIAS_LR = 1e-3
WEIGHT_DECAY = 1e-4
STEPS = 300
CHECKPOINT_AT = STEPS // 2


class Linear(tc.TreeClass):
    weight: jax.Array
    bias: jax.Array

    def __call__(self, x: jax.Array) -> jax.Array:
        return x @ self.weight + self.bias


class MLP(tc.TreeClass):
    def __init__(self, sizes: list[int], rng: np.random.Generator) -> None:
        self.layers = tuple(
            Linear(_f32(rng.normal(size=(i, o)) / np.sqrt(i)), _f32(np.zeros(o)))
            for i, o in zip(sizes[:-1], sizes[1:])
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        for layer in self.layers[:-1]:
            x = jnp.tanh(layer(x))
        return self.layers[-1](x)


def _f32(x: np.ndarray) -> jax.Array:
    # numpy draws the values: eager jax.random calls would each compile a small program
    return jnp.asarray(x, dtype=jnp.float32)


def make_data(rng: np.random.Generator, n: int = 256) -> tuple[jax.Array, jax.Array]:
    x = rng.normal(size=(n, 4))
    a, b = rng.normal(size=(4, 1)), rng.normal(size=(4, 1))
    return _f32(x), _f32(np.sin(x @ a) + 0.1 * (x @ b))


def thaw(model: MLP) -> MLP:
    """The frozen first layer back as arrays for the forward pass (and nothing else)."""
    return model.at["layers"][0].apply(tc.unfreeze, is_leaf=tc.is_frozen)


def loss_fn(model: MLP, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((thaw(model)(x) - y) ** 2)


def make_model(seed: int) -> MLP:
    model = MLP([4, 32, 32, 1], np.random.default_rng(seed))
    return model.at["layers"][0].apply(tc.freeze)  # every leaf of the first layer


def save_and_load(
    model: MLP, state: optax.OptState, opt: optax.GradientTransformation
) -> tuple[MLP, optax.OptState]:
    """Write model and optimizer state to a file, then read them into a fresh template."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "checkpoint.safetensors")
        tc.save(path, {"model": model, "opt_state": state})
        # what a restarted script builds before it loads: the model made as in `main`,
        # and its optimizer state; all their data, the frozen layer's too, comes from
        # the file
        new = make_model(1)
        restored = tc.load(path, {"model": new, "opt_state": opt.init(new)})
    return restored["model"], restored["opt_state"]


def main() -> dict:
    x, y = make_data(np.random.default_rng(0))
    model = make_model(1)
    first_layer = thaw(model).layers[0]

    def label(params: MLP) -> MLP:
        # every trainable leaf must be claimed (`default=None`)
        selections = {"weight": params.at[Linear]["weight"], "bias": params.at[Linear]["bias"]}
        return tc.optim.labels(params, selections, default=None).tree

    labels = tc.optim.labels(
        model, {"weight": model.at[Linear]["weight"], "bias": model.at[Linear]["bias"]}
    )
    # `trainable` trains the parameters only and keeps no optimizer state for the frozen
    # layer; the transform inside sees the trainable leaves, so its labels are a function
    opt = tc.optim.trainable(
        optax.multi_transform(
            {
                "weight": optax.adamw(WEIGHT_LR, weight_decay=WEIGHT_DECAY),
                "bias": optax.adam(BIAS_LR),
            },
            label,
        ),
        model,
    )
    state = opt.init(model)

    @jax.jit
    def step(model, state):
        loss, grads = jax.value_and_grad(loss_fn)(model, x, y)
        updates, state = opt.update(grads, state, model)
        # `tc.optim.apply_updates`: `optax.apply_updates` would cast every leaf it adds
        # to (weak types, 64-bit scalars), the untrained ones too
        return tc.optim.apply_updates(model, updates), state, loss, updates

    losses = []
    for i in range(STEPS):
        if i == CHECKPOINT_AT:
            in_memory = model, state
            model, state = save_and_load(model, state, opt)
        model, state, loss, updates = step(model, state)
        losses.append(float(loss))
        if i == 0:
            first_updates = updates

    # the same steps from the state in memory: the checkpoint must change nothing
    reference = []
    reference_model, reference_state = in_memory
    for _ in range(CHECKPOINT_AT, STEPS):
        reference_model, reference_state, loss, _ = step(reference_model, reference_state)
        reference.append(float(loss))

    trained = thaw(model).layers[0]
    return {
        "losses": losses,
        "frozen_layer_unchanged": all(
            np.asarray(a).tobytes() == np.asarray(b).tobytes()
            for a, b in zip(jax.tree.leaves(first_layer), jax.tree.leaves(trained))
        ),
        # the first Adam step of each group, as max |update| over its leaves
        "first_weight_step": max(
            float(jnp.abs(layer.weight).max()) for layer in first_updates.layers[1:]
        ),
        "first_bias_step": max(
            float(jnp.abs(layer.bias).max()) for layer in first_updates.layers[1:]
        ),
        "trainable_leaves": len(jax.tree.leaves(model)),
        "resumed_losses_identical": losses[CHECKPOINT_AT:] == reference,
        "labels": labels.tree,
    }


if __name__ == "__main__":
    figures = main()
    print(f"loss {figures['losses'][0]:.4f} -> {figures['losses'][-1]:.4f}")
    print(f"frozen first layer unchanged: {figures['frozen_layer_unchanged']}")
    print(f"resumed from a checkpoint identically: {figures['resumed_losses_identical']}")
    print(
        f"first step: weights {figures['first_weight_step']:.2e}, "
        f"biases {figures['first_bias_step']:.2e}"
    )
