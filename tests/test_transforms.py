"""Frozen values and masked trees under JAX transformations (jit, grad, vmap, scan, ...).

The many-device checks run in a subprocess (tests/multidevice_check.py) because the
number of CPU devices is fixed when jax is imported.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from multidevice import run_check_script

import treeclass as tc

ACTIVATIONS = {"identity": lambda x: x, "relu": jax.nn.relu, "tanh": jnp.tanh}


class Linear(tc.TreeClass):
    weight: jax.Array
    bias: jax.Array
    act: Any = "identity"

    def __call__(self, x: jax.Array) -> jax.Array:
        return ACTIVATIONS[tc.unfreeze(self.act)](x @ self.weight + self.bias)


class MLP(tc.TreeClass):
    def __init__(self, sizes: list[int], key: jax.Array) -> None:
        keys = jax.random.split(key, len(sizes) - 1)
        self.layers = tuple(
            Linear(jax.random.normal(k, (i, o)) / np.sqrt(i), jnp.zeros(o), "tanh")
            for k, i, o in zip(keys, sizes[:-1], sizes[1:])
        )
        self.steps = 0
        self.token_ids = jnp.arange(3)

    def __call__(self, x: jax.Array) -> jax.Array:
        for layer in self.layers:
            x = layer(x)
        return x


def _loss(model: MLP, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((model(x) - y) ** 2)


def _data(n: int = 16) -> tuple[jax.Array, jax.Array]:
    x = jax.random.normal(jax.random.key(1), (n, 3))
    return x, jnp.sin(x.sum(axis=1, keepdims=True))


def _indexer_ready() -> bool:
    try:
        tc.at({"a": 1})["a"].get()
        return True
    except Exception:
        return False


needs_indexer = pytest.mark.skipif(not _indexer_ready(), reason="the .at indexer is not built yet")


def _traced_counter():
    traces: list[int] = []

    @jax.jit
    def f(tree):
        traces.append(1)
        return sum(jnp.sum(x) for x in jax.tree_util.tree_leaves(tree))

    return f, traces


# ------------------------------------------------------------------------------------------
# jit
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make", [lambda: 2, lambda: 0.5, lambda: "relu", lambda: (1, "a"), lambda: jnp.arange(3.0)],
    ids=["int", "float", "str", "tuple", "array"],
)  # fmt: skip
def test_jit_does_not_retrace_for_equal_values_frozen_separately(make):
    f, traces = _traced_counter()
    f({"w": jnp.ones(2), "meta": tc.freeze(make())})
    f({"w": jnp.zeros(2), "meta": tc.freeze(make())})
    assert len(traces) == 1


def test_jit_does_not_retrace_for_equal_distinct_frozen_arrays_in_a_model():
    f, traces = _traced_counter()
    f(tc.tree_mask(MLP([3, 4], jax.random.key(0))))
    f(tc.tree_mask(MLP([3, 4], jax.random.key(0))))
    assert len(traces) == 1


@pytest.mark.parametrize(
    "a, b",
    [(2, 3), (2, 2.0), ("relu", "tanh"), (jnp.arange(3.0), jnp.arange(3.0) + 1),
     (jnp.arange(3.0), jnp.arange(4.0)), (jnp.arange(3.0), jnp.arange(3))],
    ids=["int", "int-vs-float", "str", "array-values", "array-shape", "array-dtype"],
)  # fmt: skip
def test_jit_retraces_when_a_frozen_value_changes(a, b):
    f, traces = _traced_counter()
    f({"w": jnp.ones(2), "meta": tc.freeze(a)})
    f({"w": jnp.ones(2), "meta": tc.freeze(b)})
    assert len(traces) == 2


def test_jit_dispatch_with_the_same_frozen_value_never_compares_values():
    compared = []

    class Config:
        def __hash__(self):
            return 7

        def __eq__(self, other):
            compared.append(1)
            return isinstance(other, Config)

    f, traces = _traced_counter()
    tree = {"w": jnp.ones(2), "config": tc.freeze(Config())}
    for _ in range(3):
        f(tree)
    assert len(traces) == 1 and compared == []


def test_strings_functions_and_objects_travel_through_jit_when_frozen():
    class Config:
        scale = 3.0

    @jax.jit
    def f(tree):
        act = ACTIVATIONS[tc.unfreeze(tree["act"])]
        return tc.unfreeze(tree["fn"])(act(tree["x"])) * tc.unfreeze(tree["config"]).scale

    tree = {"x": jnp.array([-1.0, 2.0]), "act": tc.freeze("relu"), "fn": tc.freeze(jnp.sqrt)}
    tree["config"] = tc.freeze(Config())
    assert f(tree).tolist() == pytest.approx([0.0, 3.0 * np.sqrt(2.0)])


def test_unfrozen_string_cannot_travel_through_jit():
    with pytest.raises(TypeError, match=r"type <class 'str'> .* at path t\['act'\]"):
        jax.jit(lambda t: t)({"act": "relu"})


def test_jit_returns_frozen_values_unchanged():
    frozen = tc.freeze("relu")
    out = jax.jit(lambda t: jax.tree_util.tree_map(lambda x: x * 2, t))({"a": 1.0, "b": frozen})
    assert out["b"] is frozen and out["a"] == 2.0


def test_jit_of_a_masked_model_forward():
    model = MLP([3, 5, 1], jax.random.key(0))
    masked = tc.tree_mask(model)
    x, _ = _data()
    out = jax.jit(lambda m, x: tc.tree_unmask(m)(x))(masked, x)
    np.testing.assert_allclose(out, model(x), rtol=1e-6)


def test_frozen_array_is_a_compile_time_constant_under_jit():
    @jax.jit
    def f(tree):
        return jnp.asarray(tc.unfreeze(tree["table"]))[tree["i"]]

    assert int(f({"table": tc.freeze(np.array([10, 20, 30])), "i": 2})) == 30


# ------------------------------------------------------------------------------------------
# grad
# ------------------------------------------------------------------------------------------


def test_grad_has_the_class_and_structure_of_the_masked_model():
    masked = tc.tree_mask(MLP([3, 5, 1], jax.random.key(0)))
    x, y = _data()
    grads = jax.grad(lambda m: _loss(tc.tree_unmask(m), x, y))(masked)
    assert type(grads) is MLP and type(grads.layers[0]) is Linear
    assert jax.tree_util.tree_structure(grads) == jax.tree_util.tree_structure(masked)


def test_grad_carries_the_frozen_value_at_frozen_positions():
    masked = tc.tree_mask(MLP([3, 5, 1], jax.random.key(0)))
    x, y = _data()
    grads = jax.grad(lambda m: _loss(tc.tree_unmask(m), x, y))(masked)
    assert grads.steps is masked.steps and grads.token_ids is masked.token_ids
    assert grads.layers[1].act is masked.layers[1].act


def test_value_and_grad_of_a_masked_model():
    masked = tc.tree_mask(MLP([3, 5, 1], jax.random.key(0)))
    x, y = _data()
    value, grads = jax.value_and_grad(lambda m: _loss(tc.tree_unmask(m), x, y))(masked)
    assert value == pytest.approx(float(_loss(tc.tree_unmask(masked), x, y)), rel=1e-6)
    assert jax.tree_util.tree_structure(grads) == jax.tree_util.tree_structure(masked)


def test_mask_unmask_recipe_matches_gradients_of_the_float_leaves():
    model = MLP([3, 5, 1], jax.random.key(0))
    x, y = _data()
    grads = jax.grad(lambda m: _loss(tc.tree_unmask(m), x, y))(tc.tree_mask(model))

    def loss_of_weights(ws):
        layers = tuple(Linear(w, b, "tanh") for w, b in ws)
        return jnp.mean((_forward(layers, x) - y) ** 2)

    expected = jax.grad(loss_of_weights)([(layer.weight, layer.bias) for layer in model.layers])
    for layer, (gw, gb) in zip(grads.layers, expected):
        np.testing.assert_allclose(layer.weight, gw, rtol=1e-6)
        np.testing.assert_allclose(layer.bias, gb, rtol=1e-6)


def _forward(layers, x):
    for layer in layers:
        x = layer(x)
    return x


def test_grad_without_masking_fails_on_an_int_leaf():
    with pytest.raises(TypeError, match="grad requires real- or complex-valued inputs"):
        jax.grad(lambda t: t["w"])({"w": 1.0, "n": 1})


def test_grad_without_masking_fails_on_a_string_leaf():
    model = MLP([3, 1], jax.random.key(0))
    with pytest.raises(TypeError, match="'tanh' of type <class 'str'> is not a valid JAX type"):
        jax.grad(lambda m: _loss(m, *_data()))(model)


def test_grad_with_masking_succeeds_where_plain_grad_fails():
    model = MLP([3, 1], jax.random.key(0))
    grads = jax.grad(lambda m: _loss(tc.tree_unmask(m), *_data()))(tc.tree_mask(model))
    assert grads.layers[0].weight.shape == (3, 1)


# ------------------------------------------------------------------------------------------
# training with optax
# ------------------------------------------------------------------------------------------


def _train(masked: Any, steps: int = 20) -> tuple[Any, list[float]]:
    x, y = _data()
    optimizer = optax.adam(1e-2)
    state = optimizer.init(masked)

    @jax.jit
    def step(masked, state):
        loss, grads = jax.value_and_grad(lambda m: _loss(tc.tree_unmask(m), x, y))(masked)
        updates, state = optimizer.update(grads, state, masked)
        return optax.apply_updates(masked, updates), state, loss

    losses = []
    for _ in range(steps):
        masked, state, loss = step(masked, state)
        losses.append(float(loss))
    return masked, losses


def test_training_keeps_frozen_layers_bit_identical():
    model = MLP([3, 8, 8, 1], jax.random.key(0))
    first = model.layers[0]
    frozen_first = tc.tree_mask(model, lambda x: x is first, is_leaf=lambda x: x is first)
    assert tc.is_frozen(frozen_first.layers[0])
    trained, losses = _train(tc.tree_mask(frozen_first))
    assert losses[-1] < losses[0]
    kept = tc.unfreeze(tc.tree_unmask(trained).layers[0])
    assert np.array_equal(kept.weight, first.weight) and np.array_equal(kept.bias, first.bias)
    assert not np.array_equal(tc.tree_unmask(trained).layers[1].weight, model.layers[1].weight)


def test_training_a_masked_model_updates_only_float_leaves():
    model = MLP([3, 8, 1], jax.random.key(0))
    trained, losses = _train(tc.tree_mask(model))
    assert losses[-1] < losses[0]
    unmasked = tc.tree_unmask(trained)
    assert unmasked.steps == 0 and np.array_equal(unmasked.token_ids, model.token_ids)
    assert unmasked.layers[0].act == "tanh"


def test_training_does_not_retrace_after_the_first_step():
    model = tc.tree_mask(MLP([3, 4, 1], jax.random.key(0)))
    traces = []
    x, y = _data()

    @jax.jit
    def step(m):
        traces.append(1)
        grads = jax.grad(lambda m: _loss(tc.tree_unmask(m), x, y))(m)
        return jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, m, grads)

    for _ in range(5):
        model = step(model)
    assert len(traces) == 1


@needs_indexer
def test_training_with_layers_frozen_through_the_indexer():
    model = MLP([3, 8, 8, 1], jax.random.key(0))
    frozen = model.at["layers"][0].apply(tc.freeze)
    trained, _ = _train(tc.tree_mask(frozen))
    kept = tc.unfreeze(tc.tree_unmask(trained).layers[0])
    assert np.array_equal(kept.weight, model.layers[0].weight)


@needs_indexer
def test_training_with_biases_frozen_by_class_selector():
    model = MLP([3, 8, 1], jax.random.key(0))
    frozen = model.at[Linear]["bias"].apply(tc.freeze)
    trained, _ = _train(tc.tree_mask(frozen))
    for before, after in zip(model.layers, tc.tree_unmask(trained).layers):
        assert np.array_equal(after.bias, before.bias)
        assert not np.array_equal(after.weight, before.weight)


# ------------------------------------------------------------------------------------------
# vmap, scan, checkpoint, eval_shape
# ------------------------------------------------------------------------------------------


def test_vmap_over_inputs_with_a_masked_model():
    model = MLP([3, 5, 1], jax.random.key(0))
    x, _ = _data()
    out = jax.vmap(lambda m, xi: tc.tree_unmask(m)(xi), in_axes=(None, 0))(tc.tree_mask(model), x)
    np.testing.assert_allclose(out, model(x), rtol=1e-6)


def test_vmap_does_not_batch_frozen_values():
    seen = {}
    tree = {"w": jnp.ones((4, 2)), "table": tc.freeze(jnp.arange(3.0)), "name": tc.freeze("n")}

    def f(t):
        seen["table_shape"] = tc.unfreeze(t["table"]).shape
        return t["w"].sum() + tc.unfreeze(t["table"]).sum()

    out = jax.vmap(f)(tree)
    assert seen["table_shape"] == (3,) and out.shape == (4,)


def test_vmap_output_keeps_frozen_values():
    frozen = tc.freeze("meta")
    out = jax.vmap(lambda t: t)({"w": jnp.ones((4, 2)), "m": frozen})
    assert out["m"] is frozen and out["w"].shape == (4, 2)


def _tanh_layer(key: jax.Array) -> Linear:
    # every layer freezes its own "tanh": equal frozen values, so the layers stack
    return Linear(jax.random.normal(key, (3, 3)) / 2, jnp.zeros(3), tc.freeze("tanh"))


def _stack(trees):
    return jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *trees)


def test_scan_over_stacked_layers_with_frozen_metadata():
    keys = jax.random.split(jax.random.key(0), 4)
    layers = [_tanh_layer(k) for k in keys]
    stacked = _stack(layers)
    assert tc.is_frozen(stacked.act) and stacked.weight.shape == (4, 3, 3)
    x = jnp.ones((2, 3))
    out, _ = jax.lax.scan(lambda h, layer: (layer(h), None), x, stacked)
    np.testing.assert_allclose(out, _forward(layers, x), rtol=1e-6)


def test_grad_through_scan_over_stacked_layers():
    keys = jax.random.split(jax.random.key(0), 3)
    layers = [_tanh_layer(k) for k in keys]
    x = jnp.ones((2, 3))

    def loss(stacked):
        out, _ = jax.lax.scan(lambda h, layer: (layer(h), None), x, stacked)
        return out.sum()

    grads = jax.grad(loss)(_stack(layers))
    expected = jax.grad(lambda ls: _forward(ls, x).sum())(layers)
    np.testing.assert_allclose(grads.weight, _stack(expected).weight, rtol=1e-5)
    assert grads.act == tc.freeze("tanh")


def test_checkpoint_gives_the_same_gradients():
    masked = tc.tree_mask(MLP([3, 5, 1], jax.random.key(0)))
    x, y = _data()

    def loss(m):
        return _loss(tc.tree_unmask(m), x, y)

    plain = jax.grad(loss)(masked)
    remat = jax.grad(jax.checkpoint(loss))(masked)
    assert jax.tree_util.tree_structure(remat) == jax.tree_util.tree_structure(plain)
    for a, b in zip(jax.tree_util.tree_leaves(plain), jax.tree_util.tree_leaves(remat)):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_eval_shape_keeps_frozen_values_and_gives_shapes():
    masked = tc.tree_mask(MLP([3, 5, 1], jax.random.key(0)))
    shapes = jax.eval_shape(lambda m: m, masked)
    assert shapes.steps is masked.steps
    assert shapes.layers[0].weight.shape == (3, 5)
    assert isinstance(shapes.layers[0].weight, jax.ShapeDtypeStruct)
    out = jax.eval_shape(lambda m, x: tc.tree_unmask(m)(x), masked, jnp.ones((7, 3)))
    assert out.shape == (7, 1)


# ------------------------------------------------------------------------------------------
# many devices (8 CPU devices, in a subprocess)
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def multidevice_results() -> dict:
    return run_check_script("multidevice_check.py")


MULTIDEVICE_CHECKS = [
    "eight_devices",
    "device_put_with_a_sharding_tree",
    "device_put_keeps_frozen_values",
    "jit_in_and_out_shardings",
    "data_parallel_training_matches_single_device",
    "model_parallel_training_matches_single_device",
    "frozen_layers_stay_bit_identical_in_parallel_training",
    "shard_map_forward_matches_single_device",
    "shard_map_data_parallel_gradients_match",
]


@pytest.mark.parametrize("check", MULTIDEVICE_CHECKS)
def test_many_devices(multidevice_results, check):
    assert multidevice_results[check] == "ok", multidevice_results[check]


@pytest.mark.parametrize(
    "check", ["sharding_tree_built_with_the_indexer", "jit_with_indexer_shardings"]
)
@needs_indexer
def test_many_devices_with_indexer_shardings(multidevice_results, check):
    assert multidevice_results[check] == "ok", multidevice_results[check]
