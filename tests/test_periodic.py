"""Periodic stacks (`tc.Periodic`): a repeating pattern of block kinds, scanned one pattern a
step, addressed by layer, printed, trained and checkpointed as the unrolled model is."""

from __future__ import annotations

import pickle
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import treeclass as tc

optax = pytest.importorskip("optax")

WIDTH = 4
PERIOD = 3  # two local blocks, one global


class Local(tc.TreeClass):
    w: jax.Array

    def __call__(self, x):
        return x + jnp.tanh(x @ self.w)


class Global(tc.TreeClass):
    w: jax.Array
    b: jax.Array

    def __call__(self, x):
        return x + 0.5 * jnp.tanh(x @ self.w + self.b)


def pattern(key):
    k = jax.random.split(key, PERIOD)
    w = [jax.random.normal(kk, (WIDTH, WIDTH)) / WIDTH for kk in k]
    return (Local(w[0]), Local(w[1]), Global(w[2], jnp.zeros(WIDTH)))


class Net(tc.TreeClass):
    layers: tc.Periodic
    head: jax.Array

    def __call__(self, x):
        return self.layers(x) @ self.head


class Unrolled(tc.TreeClass):
    layers: tuple
    head: jax.Array

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x @ self.head


def net(repeats=4):
    layers = tc.Periodic.from_init(pattern, jax.random.split(jax.random.key(0), repeats))
    return Net(layers, jnp.ones((WIDTH, 1)))


def unrolled(model):
    return Unrolled(model.layers.layers(), model.head)


def x_batch():
    return jax.random.normal(jax.random.key(1), (3, WIDTH))


def same(a, b):
    return jax.tree.structure(a) == jax.tree.structure(b) and all(
        np.array_equal(np.asarray(x), np.asarray(y))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
    )


def close(a, b, tol=1e-6):
    return all(
        np.allclose(np.asarray(x), np.asarray(y), atol=tol, rtol=tol)
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


# -- building and layers ------------------------------------------------------------------------


def test_layers_are_numbered_as_in_the_unrolled_model():
    model = net(4)
    layers = model.layers
    assert (len(layers), layers.period, layers.repeats) == (12, 3, 4)
    kinds = [type(layer) for layer in layers]
    assert kinds == [Local, Local, Global] * 4
    for i in range(12):
        r, j = divmod(i, 3)
        assert same(layers[i], layers.stack[r][j])
        assert same(layers[i - 12], layers[i])


def test_from_init_traces_the_pattern_once():
    calls = []

    def make(key):
        calls.append(key)
        return pattern(key)

    tc.Periodic.from_init(make, jax.random.split(jax.random.key(0), 6))
    assert len(calls) == 1


def test_from_layers_and_layers_are_inverses():
    model = net(3)
    again = tc.Periodic.from_layers(model.layers.layers(), period=3)
    assert same(again, model.layers) and again.period == 3


def test_from_layers_refuses_a_count_that_is_not_whole_repeats():
    layers = net(2).layers.layers()
    with pytest.raises(ValueError, match="5 layers do not repeat a pattern of 3"):
        tc.Periodic.from_layers(layers[:5], period=3)


def test_from_layers_names_the_layer_that_breaks_the_pattern():
    layers = list(net(2).layers.layers())
    layers[4], layers[5] = layers[5], layers[4]  # a global block where a local one goes
    with pytest.raises(ValueError, match=r"(?s)blocks\[1\]\[1\].*is layer r × 3 \+ j"):
        tc.Periodic.from_layers(layers, period=3)


def test_from_layers_names_a_shape_that_differs():
    layers = list(net(2).layers.layers())
    layers[3] = Local(jnp.ones((WIDTH, WIDTH + 1)))
    with pytest.raises(ValueError, match=r"blocks\[1\]\[0\]\.w"):
        tc.Periodic.from_layers(layers, period=3)


@pytest.mark.parametrize("bad", [tc.Stacked({"w": jnp.ones((2, 3))}), (1, 2), None])
def test_wrapping_anything_but_a_stack_of_patterns_is_an_error(bad):
    with pytest.raises(TypeError, match="whose blocks are patterns"):
        tc.Periodic(bad)


def test_from_init_needs_a_pattern_and_keys():
    with pytest.raises(TypeError, match="tuple or list of blocks"):
        tc.Periodic.from_init(lambda k: Local(jnp.ones(2)), jax.random.split(jax.random.key(0), 2))
    with pytest.raises(ValueError, match="at least one block"):
        tc.Periodic.from_init(pattern, jax.random.split(jax.random.key(0), 0))


def test_a_layer_index_out_of_range_is_an_index_error():
    with pytest.raises(IndexError, match="Layer 12 out of range for a periodic stack of 12"):
        net(4).layers[12]


# -- applying -----------------------------------------------------------------------------------


def test_call_matches_the_unrolled_loop():
    model = net(4)
    assert close(model(x_batch()), unrolled(model)(x_batch()))


def test_the_pattern_is_traced_once_per_scan_however_many_repeats():
    traced = []

    class Counting(Local):
        def __call__(self, x):
            traced.append(1)
            return super().__call__(x)

    def make(key):
        return (Counting(jnp.eye(WIDTH)), Global(jnp.eye(WIDTH), jnp.zeros(WIDTH)))

    for repeats in (2, 8):
        traced.clear()
        layers = tc.Periodic.from_init(make, jax.random.split(jax.random.key(0), repeats))
        jax.jit(lambda p, x: p(x))(layers, x_batch())
        assert len(traced) == 1


def test_scan_outputs_and_inputs_are_per_layer():
    model = net(2)
    xs = jnp.arange(6.0)

    def step(layer, carry, x):
        return carry + x, carry

    total, seen = model.layers.scan(step, jnp.float32(0.0), xs)
    assert float(total) == 15.0 and seen.tolist() == [0.0, 0.0, 1.0, 3.0, 6.0, 10.0]


def test_scan_outputs_of_different_shapes_per_position_are_an_error():
    def step(layer, carry):
        return carry, layer.w if isinstance(layer, Global) else layer.w[0]

    with pytest.raises(ValueError, match="every position of the pattern"):
        net(2).layers.scan(step, jnp.float32(0.0))


def test_gradients_under_jit_match_the_unrolled_model():
    model, x = net(3), x_batch()
    loss = lambda m: jnp.mean(m(x) ** 2)  # noqa: E731
    grads = jax.jit(jax.grad(loss))(model)
    ref = jax.grad(loss)(unrolled(model))
    assert isinstance(grads.layers, tc.Periodic)
    assert close(grads.layers.layers(), ref.layers, 1e-5) and close(grads.head, ref.head, 1e-5)


def test_remat_gives_the_same_gradients():
    model, x = net(2), x_batch()

    def loss(m, remat):
        out = m.layers.scan(lambda layer, c: (layer(c), None), x, remat=remat)[0]
        return jnp.mean(out**2)

    assert close(jax.grad(loss)(model, False), jax.grad(loss)(model, True), 1e-5)


def test_an_optax_step_trains_as_the_unrolled_model_does():
    model, x = net(2), x_batch()
    opt = optax.adam(1e-2)

    def train(m):
        state = opt.init(m)
        for _ in range(3):
            grads = jax.grad(lambda m: jnp.mean(m(x) ** 2))(m)
            updates, state = opt.update(grads, state, m)
            m = optax.apply_updates(m, updates)
        return m

    stacked, ref = train(model), train(unrolled(model))
    assert close(stacked.layers.layers(), ref.layers, 1e-5)


def test_freezing_the_global_layers_trains_only_the_local_ones():
    model, x = net(2), x_batch()
    factors = model.at[...].set(1.0).at["layers"][2::3].set(0.0)
    opt = optax.chain(optax.sgd(0.1), tc.optim.scale_blocks(factors))
    state = opt.init(model)
    grads = jax.grad(lambda m: jnp.mean(m(x) ** 2))(model)
    updates, state = opt.update(grads, state, model)
    new = optax.apply_updates(model, updates)
    for i in range(6):
        moved = not np.array_equal(np.asarray(new.layers[i].w), np.asarray(model.layers[i].w))
        assert moved == (i % 3 != 2)


# -- `.at` by layer -----------------------------------------------------------------------------


@pytest.mark.parametrize("index", [0, 4, 5, 11, -1, -7])
def test_at_set_of_any_layer_edits_that_layer_as_the_unrolled_model(index):
    model = net(4)
    edited = model.at["layers"][index]["w"].set(0.5)
    ref = unrolled(model).at["layers"][index]["w"].apply(lambda w: jnp.full_like(w, 0.5))
    assert isinstance(edited.layers, tc.Periodic)
    assert same(edited.layers.layers(), ref.layers)
    assert same(model.layers.layers(), unrolled(net(4)).layers)  # the input is as it was


@pytest.mark.parametrize("index", [3, 5])
def test_at_get_and_apply_of_one_layer(index):
    model = net(4)
    got = model.at["layers"][index]["w"].get()
    assert np.array_equal(np.asarray(got.layers[index].w), np.asarray(model.layers[index].w))
    doubled = model.at["layers"][index]["w"].apply(lambda w: w * 2)
    assert close(doubled.layers[index].w, model.layers[index].w * 2)
    assert same(doubled.layers[index - 1], model.layers[index - 1])


def test_at_a_stepped_slice_selects_one_position_of_every_repeat():
    model = net(4)
    edited = model.at["layers"][2::3]["b"].apply(lambda b: b + 1)
    for i, layer in enumerate(edited.layers):
        if i % 3 == 2:
            assert layer.b.tolist() == [1.0] * WIDTH
        else:
            assert same(layer, model.layers[i])


def test_at_class_selector_and_glob_reach_the_layers():
    model = net(2)
    edited = model.at[Global]["b"].apply(lambda b: b + 2)
    assert all(edited.layers[i].b.tolist() == [2.0] * WIDTH for i in (2, 5))
    globbed = model.at[tc.glob("layers.*.b")].apply(lambda b: b + 3)
    assert all(globbed.layers[i].b.tolist() == [3.0] * WIDTH for i in (2, 5))


def test_at_where_sees_the_layer_index_in_the_path():
    model = net(2)
    fifth = tc.where(lambda path, node: path[1:2] == (jax.tree_util.SequenceKey(4),))
    edited = model.at[fifth]["w"].apply(jnp.zeros_like)
    assert float(abs(edited.layers[4].w).sum()) == 0.0
    assert float(abs(edited.layers[1].w).sum()) != 0.0


def test_at_errors_name_the_layer_and_leave_the_input():
    model = net(2)
    with pytest.raises(TypeError, match=re.escape("Net.layers[4].w")):
        model.at["layers"][4]["w"].set(jnp.ones(3))
    with pytest.raises(ValueError, match=re.escape("Net.layers[4]")):
        model.at["layers"][4].set(model.layers[5])
    with pytest.raises(IndexError):
        model.at["layers"][6].get()


def test_at_set_inside_jit():
    model = net(2)
    out = jax.jit(lambda m, v: m.at["layers"][3]["w"].set(v))(model, 2.0)
    assert out.layers[3].w.tolist() == [[2.0] * WIDTH] * WIDTH


def test_at_on_the_periodic_stack_itself():
    layers = net(2).layers
    edited = layers.at[5]["b"].set(1.0)
    assert edited[5].b.tolist() == [1.0] * WIDTH and edited[2].b.tolist() == [0.0] * WIDTH


# -- printing -----------------------------------------------------------------------------------


def test_repr_shows_the_pattern_compactly_with_per_repeat_shapes():
    text = repr(net(4))
    assert "Periodic[4×(2×Local, Global)]" in text
    assert "4×f32[4,4]" in text and text.count("Local(") == 2


def test_summary_and_diagram_show_the_pattern():
    summary = tc.tree_summary(net(4))
    assert "layers.pattern[2].b" in summary and "4×f32[4]" in summary
    assert "Periodic[4×(2×Local, Global)]" in tc.tree_diagram(net(4))


def test_pickle_keeps_the_periodic_stack():
    model = net(2)
    again = pickle.loads(pickle.dumps(model))
    assert isinstance(again.layers, tc.Periodic) and same(again, model)


def test_a_periodic_stack_is_immutable():
    with pytest.raises(AttributeError, match="immutable"):
        net(2).layers.x = 1


# -- checkpoints --------------------------------------------------------------------------------


def test_save_and_load_round_trip(tmp_path):
    model = net(3)
    tc.save(tmp_path / "m.safetensors", model)
    loaded = tc.load(
        tmp_path / "m.safetensors", net(3).at["layers"][...]["w"].apply(jnp.zeros_like)
    )
    assert isinstance(loaded.layers, tc.Periodic) and same(loaded, model)


def test_unstack_all_names_tensors_per_layer_as_the_unrolled_model(tmp_path):
    model = net(2)
    tc.save(tmp_path / "per_layer.safetensors", tc.unstack_all(model))
    tc.save(tmp_path / "unrolled.safetensors", unrolled(model))
    safetensors = pytest.importorskip("safetensors.numpy")
    names = set(safetensors.load_file(tmp_path / "per_layer.safetensors"))
    assert names == set(safetensors.load_file(tmp_path / "unrolled.safetensors"))
    assert "layers.5.b" in names and "layers.4.w" in names


def test_a_per_layer_checkpoint_loads_into_the_periodic_model(tmp_path):
    model = net(2)
    tc.save(tmp_path / "unrolled.safetensors", unrolled(model))
    template = net(2).at["layers"][...]["w"].apply(jnp.zeros_like)
    loaded = tc.restack(
        tc.load(tmp_path / "unrolled.safetensors", tc.unstack_all(template)), template
    )
    assert isinstance(loaded.layers, tc.Periodic) and same(loaded, model)


def test_restack_names_another_number_of_layers():
    model = net(2)
    with pytest.raises(ValueError, match="`Periodic` of 6 blocks"):
        tc.restack({"layers": model.layers.layers()[:3]}, {"layers": model.layers})
