"""Fine-tuning: freeze a pretrained encoder by selector, train a new head, then unfreeze.

A `Classifier` holds an `Encoder` (an MLP) and a linear `head`. The encoder is
"pretrained" on task A. For a related task B the old head is replaced by a new one, and:

1. the encoder is frozen with one selection, `model.at[Encoder].apply(tc.freeze)` (every
   `Encoder`, at any depth): its arrays become pytree nodes without children, so
   `jax.grad` returns no gradient for them and the optimizer, wrapped by
   `tc.optim.trainable`, keeps no state for them (not even copies of them in the
   structure of its moments); only the head trains, with `optax.adam(1e-2)`;
2. then the same selection unfreezes it, `model.at[Encoder].apply(tc.unfreeze,
   is_leaf=tc.is_frozen)`, and the whole model trains with a ten times smaller learning
   rate, on a fresh optimizer state. (Not `tc.tree_unmask(model)`: that would also
   unfreeze values a class froze on purpose, such as a frozen activation function.)

`main()` returns the figures the tests check: the loss falls in both phases and ends
lower after phase 2; the encoder is bit-identical after phase 1 and has moved after
phase 2; the phase-1 optimizer state holds exactly as many arrays per moment as the head
has leaves.

Run it with `python docs/examples/fine_tuning.py`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

import treeclass as tc

HEAD_LR = 1e-2
FINE_TUNE_LR = 1e-3
STEPS = 200


class Linear(tc.TreeClass):
    weight: jax.Array
    bias: jax.Array

    def __call__(self, x: jax.Array) -> jax.Array:
        return x @ self.weight + self.bias


def _f32(x: np.ndarray) -> jax.Array:
    # numpy draws the values: eager jax.random calls would each compile a small program
    return jnp.asarray(x, dtype=jnp.float32)


def linear(rng: np.random.Generator, n_in: int, n_out: int) -> Linear:
    return Linear(_f32(rng.normal(size=(n_in, n_out)) / np.sqrt(n_in)), _f32(np.zeros(n_out)))


class Encoder(tc.TreeClass):
    def __init__(self, sizes: list[int], rng: np.random.Generator) -> None:
        self.layers = tuple(linear(rng, i, o) for i, o in zip(sizes[:-1], sizes[1:]))

    def __call__(self, x: jax.Array) -> jax.Array:
        for layer in self.layers:
            x = jnp.tanh(layer(x))
        return x


class Classifier(tc.TreeClass):
    encoder: Encoder
    head: Linear

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.head(self.encoder(x))


def make_tasks(rng: np.random.Generator, n: int = 256) -> tuple[jax.Array, ...]:
    """Inputs, and targets of two tasks that share features of the inputs."""
    x = rng.normal(size=(n, 8))
    features = np.tanh(x @ rng.normal(size=(8, 4)))
    task_a, task_b = rng.normal(size=(4, 1)), rng.normal(size=(4, 1))
    return _f32(x), _f32(features @ task_a), _f32(features @ task_b)


def thaw(model: Classifier) -> Classifier:
    """Unfreeze what phase 1 froze, and nothing else."""
    return model.at[Encoder].apply(tc.unfreeze, is_leaf=tc.is_frozen)


def loss_fn(model: Classifier, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((thaw(model)(x) - y) ** 2)


def train(model, opt, x, y, steps):
    opt = tc.optim.trainable(opt, model)  # the parameters only; no state for frozen values
    state = opt.init(model)

    @jax.jit
    def step(model, state):
        loss, grads = jax.value_and_grad(loss_fn)(model, x, y)
        updates, state = opt.update(grads, state, model)
        # `tc.optim.apply_updates`: `optax.apply_updates` would cast every leaf it adds
        # to (weak types, 64-bit scalars), the untrained ones too
        return tc.optim.apply_updates(model, updates), state, loss

    losses = []
    first_state = state
    for _ in range(steps):
        model, state, loss = step(model, state)
        losses.append(float(loss))
    return model, losses, first_state


def _same_bits(a, b) -> bool:
    leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(leaves_a) == len(leaves_b) and all(
        np.asarray(u).tobytes() == np.asarray(v).tobytes() for u, v in zip(leaves_a, leaves_b)
    )


def main() -> dict:
    rng = np.random.default_rng(0)
    x, y_a, y_b = make_tasks(rng)

    # "pretraining" on task A
    model = Classifier(Encoder([8, 32, 16], rng), linear(rng, 16, 1))
    model, pretrain_losses, _ = train(model, optax.adam(1e-2), x, y_a, STEPS)
    pretrained_encoder = model.encoder

    # phase 1: a new head for task B, the encoder frozen by selector
    model = Classifier(model.encoder, linear(rng, 16, 1))
    model = model.at[Encoder].apply(tc.freeze)
    model, head_losses, head_state = train(model, optax.adam(HEAD_LR), x, y_b, STEPS)
    encoder_after_phase_1 = thaw(model).encoder

    # phase 2: everything trains, more gently
    model = thaw(model)
    model, tune_losses, _ = train(model, optax.adam(FINE_TUNE_LR), x, y_b, STEPS)

    adam_state = head_state[0]  # optax.adam is a chain: (ScaleByAdamState, ...)
    return {
        "pretrain_losses": pretrain_losses,
        "head_losses": head_losses,
        "fine_tune_losses": tune_losses,
        "encoder_unchanged_in_phase_1": _same_bits(pretrained_encoder, encoder_after_phase_1),
        "encoder_changed_in_phase_2": not _same_bits(pretrained_encoder, model.encoder),
        "head_leaves": len(jax.tree.leaves(model.head)),
        "phase_1_state_mu_leaves": len(jax.tree.leaves(adam_state.mu)),
        "phase_1_state_nu_leaves": len(jax.tree.leaves(adam_state.nu)),
    }


if __name__ == "__main__":
    figures = main()
    print(
        f"pretraining on A: {figures['pretrain_losses'][0]:.4f} -> "
        f"{figures['pretrain_losses'][-1]:.4f}"
    )
    print(f"head only on B:   {figures['head_losses'][0]:.4f} -> {figures['head_losses'][-1]:.4f}")
    print(
        f"fine-tuning on B: {figures['fine_tune_losses'][0]:.4f} -> "
        f"{figures['fine_tune_losses'][-1]:.4f}"
    )
    print(f"encoder unchanged while frozen: {figures['encoder_unchanged_in_phase_1']}")
