"""The same training run with a treeclass model and with plain dict parameters.

One MLP is trained twice with `optax.adamw`, weight decay on the weights only, from the
same initial values:

- as a `TreeClass` model, whose forward pass is its `__call__` and whose decay mask is
  `tc.optim.mask(model.at[Linear]["weight"])`;
- as a plain dict of arrays, with a hand-written forward function and a hand-written
  mask.

`main()` returns both loss curves and the final parameters: they agree bit for bit at
every step, because treeclass only changes how the parameters are held and selected,
never the arithmetic that JAX and optax run.

Run it with `python docs/examples/treeclass_vs_dict.py`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

import treeclass as tc
import treeclass.optim

SIZES = [4, 32, 32, 1]
STEPS = 100
LR = 1e-2
WEIGHT_DECAY = 1e-2


class Linear(tc.TreeClass):
    weight: jax.Array
    bias: jax.Array

    def __call__(self, x: jax.Array) -> jax.Array:
        return x @ self.weight + self.bias


class MLP(tc.TreeClass):
    layers: tuple

    def __call__(self, x: jax.Array) -> jax.Array:
        for layer in self.layers[:-1]:
            x = jnp.tanh(layer(x))
        return self.layers[-1](x)


def _f32(x: np.ndarray) -> jax.Array:
    # numpy draws the values: eager jax.random calls would each compile a small program
    return jnp.asarray(x, dtype=jnp.float32)


def init_dict(rng: np.random.Generator) -> dict:
    return {
        "layers": [
            {"weight": _f32(rng.normal(size=(i, o)) / np.sqrt(i)), "bias": _f32(np.zeros(o))}
            for i, o in zip(SIZES[:-1], SIZES[1:])
        ]
    }


def dict_forward(params: dict, x: jax.Array) -> jax.Array:
    for layer in params["layers"][:-1]:
        x = jnp.tanh(x @ layer["weight"] + layer["bias"])
    last = params["layers"][-1]
    return x @ last["weight"] + last["bias"]


def make_data(rng: np.random.Generator, n: int = 256) -> tuple[jax.Array, jax.Array]:
    x = rng.normal(size=(n, 4))
    return _f32(x), _f32(np.sin(x @ rng.normal(size=(4, 1))))


def fit(params, forward, decay_mask, x, y) -> tuple[list[float], object]:
    # `trainable` selects every leaf of both (all float arrays), and adds no arithmetic
    opt = tc.optim.trainable(optax.adamw(LR, weight_decay=WEIGHT_DECAY, mask=decay_mask), params)
    state = opt.init(params)

    def loss_fn(params):
        return jnp.mean((forward(params, x) - y) ** 2)

    @jax.jit
    def step(params, state):
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, state = opt.update(grads, state, params)
        # tc.optim.apply_updates, as the docs use: leaves it does not train keep their exact
        # aval and bits (optax.apply_updates casts every sum)
        return tc.optim.apply_updates(params, updates), state, loss

    losses = []
    for _ in range(STEPS):
        params, state, loss = step(params, state)
        losses.append(float(loss))
    return losses, params


def main() -> dict:
    x, y = make_data(np.random.default_rng(0))
    params = init_dict(np.random.default_rng(1))
    model = MLP(tuple(Linear(layer["weight"], layer["bias"]) for layer in params["layers"]))

    dict_mask = {"layers": [{"weight": True, "bias": False} for _ in params["layers"]]}
    dict_losses, dict_params = fit(params, dict_forward, dict_mask, x, y)

    model_mask = tc.optim.mask(model.at[Linear]["weight"])
    model_losses, model = fit(model, lambda m, x: m(x), model_mask, x, y)

    final_dict = [
        leaf for layer in dict_params["layers"] for leaf in (layer["weight"], layer["bias"])
    ]
    return {
        "dict_losses": dict_losses,
        "treeclass_losses": model_losses,
        "final_params_identical": all(
            np.asarray(a).tobytes() == np.asarray(b).tobytes()
            for a, b in zip(final_dict, jax.tree.leaves(model))
        ),
    }


if __name__ == "__main__":
    figures = main()
    same = figures["dict_losses"] == figures["treeclass_losses"]
    print(
        f"loss {figures['dict_losses'][0]:.4f} -> {figures['dict_losses'][-1]:.4f}; "
        f"identical at every step: {same}"
    )
