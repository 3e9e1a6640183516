"""Masked TreeClass models on 8 CPU devices; run by tests/test_transforms.py in a subprocess.

The device count is fixed when jax is imported, hence a separate process. Each check runs
the same computation sharded and on one device and compares. The last stdout line is a
JSON object: check name -> "ok" or the failure's traceback.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from collections.abc import Callable  # noqa: E402
from typing import Any

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from multidevice import report  # noqa: E402

import treeclass as tc  # noqa: E402


class Linear(tc.TreeClass):
    weight: jax.Array
    bias: jax.Array
    act: Any = "tanh"

    def __call__(self, x: jax.Array) -> jax.Array:
        y = x @ self.weight + self.bias
        return jnp.tanh(y) if tc.unfreeze(self.act) == "tanh" else y


class MLP(tc.TreeClass):
    def __init__(self, sizes: list[int], key: jax.Array) -> None:
        keys = jax.random.split(key, len(sizes) - 1)
        self.layers = tuple(
            Linear(jax.random.normal(k, (i, o)) / np.sqrt(i), jnp.zeros(o) + 0.1)
            for k, i, o in zip(keys, sizes[:-1], sizes[1:])
        )
        self.steps = 0
        self.name = "mlp"

    def __call__(self, x: jax.Array) -> jax.Array:
        for layer in self.layers:
            x = layer(x)
        return x


SIZES = [8, 16, 8]
X = jax.random.normal(jax.random.key(1), (32, 8))
Y = jnp.sin(X.sum(axis=1, keepdims=True)) * jnp.ones((1, 8))


def loss(masked: Any, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((tc.tree_unmask(masked)(x) - y) ** 2)


OPTIMIZER = optax.sgd(0.1)


def train_step(masked: Any, state: Any, x: jax.Array, y: jax.Array) -> tuple[Any, Any]:
    grads = jax.grad(loss)(masked, x, y)
    updates, state = OPTIMIZER.update(grads, state, masked)
    return optax.apply_updates(masked, updates), state


def train(step: Callable, masked: Any, x: jax.Array, y: jax.Array, n: int = 10) -> Any:
    state = OPTIMIZER.init(masked)
    for _ in range(n):
        masked, state = step(masked, state, x, y)
    return masked


def model() -> Any:
    return tc.tree_mask(MLP(SIZES, jax.random.key(0)))


def assert_trees_close(a: Any, b: Any) -> None:
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=1e-5, atol=1e-6)


def is_weight(path: tuple) -> bool:
    return bool(path) and getattr(path[-1], "name", None) == "weight"


def weight_shardings(masked: Any, mesh: Mesh, spec: P) -> Any:
    """A sharding tree: `spec` for every Linear weight, replicated elsewhere."""
    replicated = NamedSharding(mesh, P())
    sharded = NamedSharding(mesh, spec)
    return jax.tree_util.tree_map_with_path(
        lambda path, _: sharded if is_weight(path) else replicated, masked
    )


def mesh_1d(name: str = "x") -> Mesh:
    return Mesh(np.array(jax.devices()), (name,))


# ------------------------------------------------------------------------------------------

CHECKS: dict[str, Callable[[], None]] = {}


def check(fn: Callable[[], None]) -> Callable[[], None]:
    CHECKS[fn.__name__] = fn
    return fn


@check
def eight_devices() -> None:
    assert len(jax.devices()) == 8, jax.devices()


@check
def device_put_with_a_sharding_tree() -> None:
    masked, mesh = model(), mesh_1d()
    placed = jax.device_put(masked, weight_shardings(masked, mesh, P("x", None)))
    weight = placed.layers[0].weight
    assert weight.sharding == NamedSharding(mesh, P("x", None)), weight.sharding
    assert len(weight.addressable_shards) == 8
    assert weight.addressable_shards[0].data.shape == (1, 16)
    assert placed.layers[0].bias.sharding.is_fully_replicated
    assert_trees_close(placed, masked)


@check
def device_put_keeps_frozen_values() -> None:
    masked, mesh = model(), mesh_1d()
    placed = jax.device_put(masked, weight_shardings(masked, mesh, P("x", None)))
    assert placed.steps is masked.steps and placed.name is masked.name
    assert placed.layers[1].act is masked.layers[1].act


@check
def jit_in_and_out_shardings() -> None:
    masked, mesh = model(), mesh_1d()
    shardings = weight_shardings(masked, mesh, P("x", None))
    data = NamedSharding(mesh, P("x", None))
    state = OPTIMIZER.init(masked)
    state_sharding = jax.tree_util.tree_map(lambda _: NamedSharding(mesh, P()), state)
    step = jax.jit(
        train_step,
        in_shardings=(shardings, state_sharding, data, data),
        out_shardings=(shardings, state_sharding),
    )
    sharded = train(step, jax.device_put(masked, shardings), X, Y, n=3)
    assert sharded.layers[1].weight.sharding == NamedSharding(mesh, P("x", None))
    assert_trees_close(sharded, train(jax.jit(train_step), masked, X, Y, n=3))


@check
def data_parallel_training_matches_single_device() -> None:
    masked, mesh = model(), mesh_1d("data")
    batch = NamedSharding(mesh, P("data", None))
    replicated = NamedSharding(mesh, P())
    params = jax.device_put(masked, replicated)
    x, y = jax.device_put(X, batch), jax.device_put(Y, batch)
    sharded = train(jax.jit(train_step), params, x, y)
    assert sharded.layers[0].weight.sharding.is_fully_replicated
    assert_trees_close(sharded, train(jax.jit(train_step), masked, X, Y))


@check
def model_parallel_training_matches_single_device() -> None:
    masked = model()
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
    shardings = weight_shardings(masked, mesh, P(None, "model"))
    params = jax.device_put(masked, shardings)
    batch = NamedSharding(mesh, P("data", None))
    x, y = jax.device_put(X, batch), jax.device_put(Y, batch)
    step = jax.jit(train_step, out_shardings=(shardings, None))
    sharded = train(step, params, x, y)
    assert sharded.layers[0].weight.sharding == NamedSharding(mesh, P(None, "model"))
    assert sharded.layers[0].weight.addressable_shards[0].data.shape == (8, 4)
    assert_trees_close(sharded, train(jax.jit(train_step), masked, X, Y))


@check
def frozen_layers_stay_bit_identical_in_parallel_training() -> None:
    plain = MLP(SIZES, jax.random.key(0))
    first = plain.layers[0]
    masked = tc.tree_mask(tc.tree_mask(plain, lambda x: x is first, is_leaf=lambda x: x is first))
    mesh = mesh_1d("data")
    batch = NamedSharding(mesh, P("data", None))
    params = jax.device_put(masked, NamedSharding(mesh, P()))
    trained = train(jax.jit(train_step), params, jax.device_put(X, batch), jax.device_put(Y, batch))
    kept = tc.unfreeze(trained.layers[0])
    assert np.array_equal(kept.weight, first.weight) and np.array_equal(kept.bias, first.bias)
    assert not np.array_equal(trained.layers[1].weight, plain.layers[1].weight)


@check
def shard_map_forward_matches_single_device() -> None:
    masked, mesh = model(), mesh_1d()

    def forward(m: Any, x: jax.Array) -> jax.Array:
        return tc.tree_unmask(m)(x)

    sharded = jax.shard_map(forward, mesh=mesh, in_specs=(P(), P("x")), out_specs=P("x"))
    out = jax.jit(sharded)(masked, X)
    np.testing.assert_allclose(out, forward(masked, X), rtol=1e-5, atol=1e-6)


@check
def shard_map_data_parallel_gradients_match() -> None:
    masked, mesh = model(), mesh_1d()

    def local_grads(m: Any, x: jax.Array, y: jax.Array) -> Any:
        # the mean over shards of the local losses is the full-batch loss; shard_map's
        # varying-axis tracking sums the replicated parameters' cotangents over "x"
        return jax.grad(lambda m: jax.lax.pmean(loss(m, x, y), "x"))(m)

    sharded = jax.shard_map(local_grads, mesh=mesh, in_specs=(P(), P("x"), P("x")), out_specs=P())
    grads = jax.jit(sharded)(masked, X, Y)
    assert grads.steps is masked.steps
    assert_trees_close(grads, jax.grad(loss)(masked, X, Y))


def _indexer_shardings(masked: Any, mesh: Mesh) -> Any:
    shardings = masked.at[...].set(NamedSharding(mesh, P()))
    return shardings.at[Linear]["weight"].set(NamedSharding(mesh, P("x", None)))


@check
def sharding_tree_built_with_the_indexer() -> None:
    masked, mesh = model(), mesh_1d()
    shardings = _indexer_shardings(masked, mesh)
    expected = weight_shardings(masked, mesh, P("x", None))
    assert jax.tree_util.tree_structure(shardings) == jax.tree_util.tree_structure(expected)
    assert jax.tree_util.tree_leaves(shardings) == jax.tree_util.tree_leaves(expected)
    placed = jax.device_put(masked, shardings)
    assert placed.layers[1].weight.sharding == NamedSharding(mesh, P("x", None))
    assert_trees_close(placed, masked)


@check
def jit_with_indexer_shardings() -> None:
    masked, mesh = model(), mesh_1d()
    shardings = _indexer_shardings(masked, mesh)
    data = NamedSharding(mesh, P("x", None))
    step = jax.jit(
        lambda m, x, y: jax.tree_util.tree_map(
            lambda p, g: p - 0.1 * g, m, jax.grad(loss)(m, x, y)
        ),
        in_shardings=(shardings, data, data),
        out_shardings=shardings,
    )
    out = step(jax.device_put(masked, shardings), X, Y)
    assert out.layers[0].weight.sharding == NamedSharding(mesh, P("x", None))
    grads = jax.grad(loss)(masked, X, Y)
    expected = jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, masked, grads)
    assert_trees_close(out, expected)


if __name__ == "__main__":
    report(CHECKS, limit=6)
