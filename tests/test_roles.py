"""Roles: what is trained, what is state, what is configuration, one answer from every tool.

`tc.roles`, `tc.optim.trainable`, `tc.tree_summary`, `.at` on static fields and whole
nodes, freezing and thawing by every selector kind, and checkpoints of a fine-tune with
a frozen backbone: each an example of a model an engineer coming from equinox or flax
would write, checked against the answer it must give.
"""

from __future__ import annotations

import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import Linear
from hypothesis import given, settings
from hypothesis import strategies as st

import treeclass as tc
import treeclass.optim

optax = pytest.importorskip("optax")


def same_bits(a, b):
    leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(leaves_a) == len(leaves_b) and all(
        np.asarray(x).dtype == np.asarray(y).dtype
        and np.asarray(x).tobytes() == np.asarray(y).tobytes()
        for x, y in zip(leaves_a, leaves_b)
    )


def linear(key, n_in, n_out):
    return Linear(jax.random.normal(key, (n_in, n_out)) / n_in**0.5, jnp.zeros(n_out))


# -- 1. Python numbers of a hand-written __init__ are leaves, not parameters ----------------


class LayerNorm(tc.TreeClass):
    def __init__(self, n):
        self.scale = jnp.ones(n)
        self.bias = jnp.zeros(n)
        self.eps = 1e-5
        self.momentum = 0.9

    def __call__(self, x):
        mean = x.mean(-1, keepdims=True)
        var = x.var(-1, keepdims=True)
        return (x - mean) / jnp.sqrt(var + self.eps) * self.scale + self.bias


def _fit(model, opt, loss, steps):
    state = opt.init(model)

    @jax.jit
    def step(model, state):
        grads = jax.grad(loss)(model)
        updates, state = opt.update(grads, state, model)
        return optax.apply_updates(model, updates), state

    for _ in range(steps):
        model, state = step(model, state)
    return model


def test_python_numbers_of_a_hand_written_init_are_not_trained():
    x = jax.random.normal(jax.random.key(0), (8, 4))

    def loss(m):  # the numbers get gradients: jax.grad sees every leaf
        return ((m(x) - 1.0) ** 2).mean() + 100 * m.eps + m.momentum

    model = LayerNorm(4)
    trained = _fit(model, tc.optim.trainable(optax.adamw(0.05), model), loss, 50)
    assert trained.eps == 1e-5 and trained.momentum == 0.9
    assert not same_bits(trained.scale, model.scale)
    # what the docs showed before: plain optax trains the numbers
    plain = _fit(model, optax.adamw(0.05), loss, 50)
    assert plain.eps != 1e-5


def test_roles_of_a_hand_written_init():
    assert tc.roles(LayerNorm(2)).eps == "other"
    assert jax.tree.leaves(tc.roles(LayerNorm(2))) == ["trainable", "trainable", "other", "other"]


def test_roles_of_every_kind_of_leaf():
    tree = {
        "f": jnp.ones(2),
        "n": np.ones(2, np.float16),
        "c": jnp.ones(1, jnp.complex64),
        "i": jnp.arange(2),
        "b": jnp.ones(1, bool),
        "p": 1.0,
        "s": "relu",
        "z": tc.freeze(jnp.ones(2)),
        "a": jax.ShapeDtypeStruct((2,), jnp.float32),
    }
    assert tc.roles(tree) == {
        "f": "trainable",
        "n": "trainable",
        "c": "trainable",
        "i": "other",
        "b": "other",
        "p": "other",
        "s": "other",
        "z": "frozen",
        "a": "trainable",
    }


def test_numpy_scalars_prng_keys_and_frozen_subtrees_are_not_trainable():
    tree = {
        "np_scalar": np.float32(1e-5),  # like a Python number: configuration
        "key": jax.random.key(0),
        "abstract_key": jax.eval_shape(lambda: jax.random.key(0)),
        "frozen_layer": tc.freeze(linear(jax.random.key(0), 2, 2)),
        "abstract": jax.ShapeDtypeStruct((2,), jnp.bfloat16),
    }
    assert tc.roles(tree) == {
        "np_scalar": "other",
        "key": "other",
        "abstract_key": "other",
        "frozen_layer": "frozen",  # one frozen value, not its leaves
        "abstract": "trainable",
    }


def test_unknown_field_role_is_an_error_naming_the_field():
    class Odd(tc.TreeClass):
        x: jax.Array = tc.field(metadata={"role": "buffer"})

    with pytest.raises(ValueError, match=r"`Odd\.x` has metadata role 'buffer'"):
        tc.roles(Odd(jnp.ones(1)))


def test_trainable_leaves_other_leaves_bit_identical_even_negative_zero():
    model = {"w": jnp.ones(2), "keep": jnp.array([-0.0, jnp.nan, jnp.inf, 1.5])}
    opt = tc.optim.trainable(optax.adamw(0.1, weight_decay=0.5), model.copy(), "w")
    state = opt.init(model)
    grads = {"w": jnp.ones(2), "keep": jnp.ones(4)}
    for _ in range(3):
        updates, state = opt.update(grads, state, model)
        model = optax.apply_updates(model, updates)
    assert same_bits(model["keep"], jnp.array([-0.0, jnp.nan, jnp.inf, 1.5]))
    assert not same_bits(model["w"], jnp.ones(2))


# -- 2. freeze and thaw are inverse for every selector kind ---------------------------------


class Block(tc.TreeClass):
    def __init__(self, key, sizes):
        keys = jax.random.split(key, len(sizes) - 1)
        self.layers = tuple(linear(k, i, o) for k, i, o in zip(keys, sizes[:-1], sizes[1:]))
        self.scale = jnp.ones(())
        self.steps = 3


def _selections(model):
    """One selection (a tuple of selectors, applied level after level) per selector kind."""
    is_matrix = tc.where(lambda path, x: isinstance(x, jax.Array) and x.ndim == 2)
    positive = tc.where(lambda path, x: isinstance(x, jax.Array) and bool((x > 0).any()))
    bool_mask = jax.tree.map(lambda x: isinstance(x, jax.Array) and x.ndim == 1, model)
    return {
        "name": ("layers",),
        "index": ("layers", -1),
        "glob": (tc.glob("layers.*.weight"),),
        "regex": (re.compile("sc.*"),),
        "class": (Linear,),
        "class then name": (Linear, "bias"),
        "bool mask": (bool_mask,),
        "where reading the value": (is_matrix,),
        "where, values that training changes": (positive,),
        "union": (("scale", is_matrix),),  # one level: the union of a name and a predicate
        "union of a class and a name": ((Linear, "scale"),),
        "glob with **": (tc.glob("**.bias"),),
        "class then where": (Linear, tc.where(lambda path, x: jnp.ndim(x) == 2)),
        "ellipsis": (...,),
    }


@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    sizes=st.lists(st.integers(1, 4), min_size=2, max_size=4),
    kind=st.sampled_from(list(_selections(Block(jax.random.key(0), [1, 1])))),
    whole=st.booleans(),
)
def test_thawing_with_the_selection_that_froze_gives_the_tree_back(seed, sizes, kind, whole):
    _freeze_then_thaw(Block(jax.random.key(seed), sizes), kind, whole)


@pytest.mark.parametrize("whole", [False, True], ids=["leaves", "whole"])
@pytest.mark.parametrize("kind", list(_selections(Block(jax.random.key(0), [1, 1]))))
def test_thawing_gives_the_tree_back_for_each_selector_kind(kind, whole):
    _freeze_then_thaw(Block(jax.random.key(0), [2, 3, 1]), kind, whole)


def _freeze_then_thaw(model, kind, whole):
    where = _selections(model)[kind]
    if kind == "bool mask" and whole:
        whole = False  # a mask selects leaves: freezing them whole is freezing them
    freezer, thawer = tc.at(model), None
    for selector in where:
        freezer = freezer[selector]
    frozen = freezer.apply(tc.freeze, whole=whole)
    assert any(tc.is_frozen(x) for x in jax.tree.leaves(frozen, is_leaf=tc.is_frozen))
    thawer = tc.at(frozen)
    for selector in where:
        thawer = thawer[selector]
    thawed = thawer.apply(tc.unfreeze, is_leaf=tc.is_frozen)
    assert jax.tree.structure(thawed) == jax.tree.structure(model)
    assert same_bits(thawed, model)


def test_thawing_with_a_value_predicate_is_not_a_silent_no_op():
    # the predicate sees the value inside the frozen wrapper: it selects the same nodes
    model = Block(jax.random.key(0), [2, 3, 1])
    sel = tc.where(lambda p, n: isinstance(n, jax.Array) and n.ndim == 2)
    frozen = model.at[sel].apply(tc.freeze)
    assert tc.is_frozen(frozen.layers[0].weight)
    thawed = frozen.at[sel].apply(tc.unfreeze, is_leaf=tc.is_frozen)
    assert not tc.is_frozen(thawed.layers[0].weight) and tc.is_tree_equal(thawed, model)
    # without `is_leaf` the frozen values are selected but hold no leaf: an error saying so
    with pytest.raises(LookupError, match="reaches no leaves"):
        frozen.at[sel].apply(tc.unfreeze)


def test_class_selector_matches_a_frozen_instance_by_its_class():
    model = Block(jax.random.key(0), [2, 3, 1]).at[Linear].apply(tc.freeze, whole=True)
    assert tc.is_frozen(model.layers[0])
    values = model.at[Linear].get(is_leaf=tc.is_frozen)
    assert tc.is_frozen(values.layers[1]) and values.scale is None


# -- 3. optimizer state holds no frozen value, and fits an abstract template --------------


class Classifier(tc.TreeClass):
    def __init__(self, key, width=32, depth=3):
        keys = jax.random.split(key, depth + 1)
        self.backbone = tuple(linear(k, width, width) for k in keys[:-1])
        self.head = linear(keys[-1], width, 2)
        self.in_scale = tc.freeze(jnp.full((width,), 0.5, jnp.float32))

    def __call__(self, x):
        x = x * tc.unfreeze(self.in_scale)
        for layer in tc.tree_unmask(self.backbone):
            x = jnp.tanh(layer(x))
        return self.head(x)


def _fine_tune(key):
    return Classifier(key).at["backbone"].apply(tc.freeze)


def _frozen_arrays(tree):
    return [x for x in jax.tree.leaves(tree, is_leaf=tc.is_frozen) if tc.is_frozen(x)]


def test_plain_optax_state_copies_the_frozen_backbone():
    model = _fine_tune(jax.random.key(0))
    state = optax.adam(1e-3).init(model)
    assert len(_frozen_arrays(state[0].mu)) == len(_frozen_arrays(model))


def test_trainable_state_holds_no_frozen_value():
    model = _fine_tune(jax.random.key(0))
    state = tc.optim.trainable(optax.adam(1e-3), model).init(model)
    assert _frozen_arrays(state) == []
    assert len(jax.tree.leaves(state[0].mu)) == len(jax.tree.leaves(model.head))


def test_checkpoint_of_model_and_adam_state_stores_each_frozen_array_once(tmp_path):
    model = _fine_tune(jax.random.key(0))
    frozen_bytes = sum(np.asarray(tc.unfreeze(x)).nbytes for x in _frozen_arrays(model))
    sizes = {}
    for name, opt in [
        ("plain", optax.adam(1e-3)),
        ("trainable", tc.optim.trainable(optax.adam(1e-3), model)),
    ]:
        path = os.path.join(tmp_path, f"{name}.safetensors")
        tc.save(path, {"model": model, "opt_state": opt.init(model)})
        sizes[name] = os.path.getsize(path)
    # adam's two moments held the frozen arrays twice more; now neither does
    assert sizes["plain"] - sizes["trainable"] >= 2 * frozen_bytes
    assert sizes["trainable"] < frozen_bytes * 1.5


def test_optimizer_built_from_the_model_initialises_an_abstract_template():
    model = _fine_tune(jax.random.key(0))
    opt = tc.optim.trainable(optax.adam(1e-3), model)
    # a template whose frozen values were built apart (another key, inside eval_shape)
    abstract = jax.eval_shape(lambda: _fine_tune(jax.random.key(1)))
    abstract_state = jax.eval_shape(opt.init, abstract)
    assert jax.tree.structure(abstract_state) == jax.tree.structure(opt.init(model))


def test_optimizer_state_restores_into_a_fresh_template(tmp_path):
    model = _fine_tune(jax.random.key(0))
    opt = tc.optim.trainable(optax.adam(1e-2), model)
    state = opt.init(model)
    grads = jax.grad(lambda m: m(jnp.ones(32)).sum())(model)
    updates, state = opt.update(grads, state, model)
    model = optax.apply_updates(model, updates)
    path = os.path.join(tmp_path, "ckpt.safetensors")
    tc.save(path, {"model": model, "opt_state": state})
    fresh = _fine_tune(jax.random.key(1))  # what a restarted script builds
    restored = tc.load(path, {"model": fresh, "opt_state": opt.init(fresh)})
    assert tc.is_tree_equal(restored["model"], model)
    assert same_bits(restored["opt_state"], state)


# -- 4. state: updated in the step, never by the optimizer, saved, shown --------------------


class BatchNorm(tc.TreeClass):
    scale: jax.Array
    bias: jax.Array
    mean: jax.Array = tc.field(metadata={"role": "state"})
    var: jax.Array = tc.field(metadata={"role": "state"})
    count: jax.Array = tc.field(metadata={"role": "state"})
    momentum: float = tc.field(default=0.9, static=True)
    training: bool = tc.field(default=True, static=True)

    @classmethod
    def create(cls, n):
        ones, zeros = jnp.ones(n), jnp.zeros(n)
        return cls(ones, zeros, zeros, ones, jnp.zeros((), jnp.int32))

    def __call__(self, x):
        if not self.training:
            return self.normalize(x, self.mean, self.var), self
        mean, var = x.mean(0), x.var(0)
        m = self.momentum
        new = self.replace(
            mean=m * self.mean + (1 - m) * mean,
            var=m * self.var + (1 - m) * var,
            count=self.count + 1,
        )
        return self.normalize(x, mean, var), new

    def normalize(self, x, mean, var):
        return (x - mean) / jnp.sqrt(var + 1e-5) * self.scale + self.bias


class Dropout(tc.TreeClass):
    rate: float = tc.field(default=0.5, static=True)
    training: bool = tc.field(default=True, static=True)

    def __call__(self, x, key):
        if not self.training:
            return x
        keep = jax.random.bernoulli(key, 1 - self.rate, x.shape)
        return jnp.where(keep, x / (1 - self.rate), 0.0)


class Net(tc.TreeClass):
    def __init__(self, key):
        self.norm = BatchNorm.create(3)
        self.drop = Dropout(0.5)
        self.out = linear(key, 3, 1)

    def __call__(self, x, key):
        x, norm = self.norm(x)
        return self.out(self.drop(x, key)), self.replace(norm=norm)


def _batches(n):
    rng = np.random.default_rng(0)
    return [jnp.asarray(rng.normal(2.0, 3.0, size=(16, 3)), jnp.float32) for _ in range(n)]


def _train_net(steps):
    model = Net(jax.random.key(0))
    opt = tc.optim.trainable(optax.adamw(1e-2, weight_decay=0.1), model)
    state = opt.init(model)

    @jax.jit
    def step(model, state, x, key):
        def loss_fn(model):
            pred, model = model(x, key)
            return jnp.mean((pred - x.sum(1, keepdims=True)) ** 2), model

        grad = jax.grad(loss_fn, has_aux=True, allow_int=True)
        grads, model = grad(model)
        updates, state = opt.update(grads, state, model)
        return optax.apply_updates(model, updates), state

    keys = jax.random.split(jax.random.key(1), steps)
    for x, key in zip(_batches(steps), keys):
        model, state = step(model, state, x, key)
    return model, state, opt


def test_batch_norm_statistics_are_the_running_averages_of_the_batches():
    model, _, _ = _train_net(20)
    mean, var = np.zeros(3), np.ones(3)
    for x in _batches(20):
        x = np.asarray(x, np.float64)
        mean = 0.9 * mean + 0.1 * x.mean(0)
        var = 0.9 * var + 0.1 * x.var(0)
    np.testing.assert_allclose(model.norm.mean, mean, rtol=1e-5)
    np.testing.assert_allclose(model.norm.var, var, rtol=1e-5)
    assert int(model.norm.count) == 20
    assert tc.roles(model).norm.mean == "state" and tc.roles(model).norm.scale == "trainable"


def test_state_is_never_updated_nor_decayed_by_the_optimizer():
    model = Net(jax.random.key(0))
    opt = tc.optim.trainable(optax.adamw(1.0, weight_decay=1.0), model)
    state = opt.init(model)
    grads = jax.tree.map(jnp.ones_like, model)
    updates, state = opt.update(grads, state, model)
    after = optax.apply_updates(model, updates)
    assert same_bits(after.norm.mean, model.norm.mean)
    assert same_bits(after.norm.count, model.norm.count)
    assert not same_bits(after.norm.scale, model.norm.scale)


def test_state_is_saved_and_restored(tmp_path):
    model, state, opt = _train_net(5)
    path = os.path.join(tmp_path, "net.safetensors")
    tc.save(path, {"model": model, "opt_state": state})
    template = Net(jax.random.key(7))
    restored = tc.load(path, {"model": template, "opt_state": opt.init(template)})
    assert same_bits(restored["model"].norm, model.norm)
    assert same_bits(restored["opt_state"], state)


def test_summary_shows_state_apart_from_parameters():
    table = tc.tree_summary(Net(jax.random.key(0)))
    assert "│ .norm.mean  │ f32[3]   │     3 │  12B │ state     │" in table
    assert "│ .norm.count │ i32[]    │     1 │   4B │ state     │" in table
    assert "│ .norm.scale │ f32[3]   │     3 │  12B │ trainable │" in table
    assert "│ Σ           │          │    10 │  40B │ trainable │" in table
    assert "│ Σ           │          │     7 │  28B │ state     │" in table
    assert "│ Σ           │ Net      │    17 │  68B │           │" in table


# -- 5. modes: one call switches every Dropout and BatchNorm, static fields included -------


def test_one_call_switches_every_dropout_and_batch_norm_to_inference():
    model, _, _ = _train_net(5)
    evaluating = model.at[Dropout, BatchNorm]["training"].set(False)
    assert not evaluating.drop.training and not evaluating.norm.training
    assert model.drop.training  # the input is unchanged
    x = _batches(1)[0]
    forward = jax.jit(lambda m, x, key: m(x, key))
    y, after = forward(evaluating, x, jax.random.key(3))
    y_other_key, _ = forward(evaluating, x, jax.random.key(4))
    norm = model.norm
    expected = (x - norm.mean) / jnp.sqrt(norm.var + 1e-5) * norm.scale + norm.bias
    np.testing.assert_allclose(
        y, model.out(expected), rtol=1e-5, atol=1e-6
    )  # no dropout, running stats
    assert same_bits(y, y_other_key)
    assert same_bits(after.norm, evaluating.norm)  # inference updates no statistics
    back = evaluating.at[Dropout, BatchNorm]["training"].set(True)
    assert jax.tree.structure(back) == jax.tree.structure(model)


def test_modes_switch_at_every_depth_and_by_path():
    model = {"a": (Dropout(), [BatchNorm.create(2), {"d": Dropout(0.1)}]), "b": Dropout()}
    evaluating = tc.at(model)[Dropout, BatchNorm]["training"].set(False)
    switched = jax.tree.leaves(evaluating, is_leaf=lambda x: isinstance(x, (Dropout, BatchNorm)))
    assert [layer.training for layer in switched] == [False, False, False, False]
    assert evaluating["a"][1][1]["d"].rate == 0.1  # the other static field kept
    assert jax.tree.structure(evaluating) != jax.tree.structure(model)
    one = tc.at(model)["a"][1][0]["training"].set(False)  # a path of names and indices
    assert not one["a"][1][0].training and one["a"][0].training and one["b"].training
    back = tc.at(evaluating)[Dropout, BatchNorm]["training"].set(True)
    assert jax.tree.structure(back) == jax.tree.structure(model)


def test_static_field_set_by_name_runs_its_on_setattr():
    class Drop(tc.TreeClass):
        rate: float = tc.field(default=0.5, static=True, on_setattr=[float])

    dropped = tc.at([Drop()])[Drop]["rate"].set(1)
    assert type(dropped[0].rate) is float and dropped[0].rate == 1.0
    doubled = tc.at([Drop()])[0]["rate"].apply(lambda r: r * 2)
    assert doubled[0].rate == 1.0


def test_static_field_set_to_an_unhashable_value_names_the_field_and_changes_nothing():
    model = [Dropout()]
    with pytest.raises(TypeError, match=r"Dropout\.rate"):
        tc.at(model)[0]["rate"].set([0.1])
    assert model[0].rate == 0.5


# -- 6 and 7. LoRA surgery on whole nodes, and what the summary counts ---------------------


class Attention(tc.TreeClass):
    def __init__(self, key, width):
        keys = jax.random.split(key, 4)
        self.query, self.key, self.value, self.out = (linear(k, width, width) for k in keys)
        self.heads = 2
        self.causal = True

    def __call__(self, x):
        q, k, v = self.query(x), self.key(x), self.value(x)
        weights = jax.nn.softmax(q @ k.T / jnp.sqrt(q.shape[-1]))
        return self.out(weights @ v)


class LoRA(tc.TreeClass):
    def __init__(self, base, rank, key):
        n_in, n_out = base.weight.shape
        self.base = tc.freeze(base)
        self.a = jax.random.normal(key, (n_in, rank)) * 0.01
        self.b = jnp.zeros((rank, n_out))

    def __call__(self, x):
        return tc.unfreeze(self.base)(x) + x @ self.a @ self.b


class Transformer(tc.TreeClass):
    def __init__(self, key, width=8, depth=2):
        keys = jax.random.split(key, depth)
        self.blocks = tuple(Attention(k, width) for k in keys)

    def __call__(self, x):
        for block in self.blocks:
            x = x + block(x)
        return x


def test_surgery_on_whole_nodes_wraps_every_attention_output():
    model = Transformer(jax.random.key(0))
    lora = model.at[Attention]["out"].apply(lambda lin: LoRA(lin, 2, jax.random.key(1)), whole=True)
    assert all(isinstance(block.out, LoRA) for block in lora.blocks)
    assert tc.is_tree_equal(tc.unfreeze(lora.blocks[0].out.base), model.blocks[0].out)
    x = jnp.ones((3, 8))
    np.testing.assert_allclose(lora(x), model(x), rtol=1e-6)  # b starts at zero
    with pytest.raises(AttributeError, match="weight"):  # leaf by leaf: the old pitfall
        model.at[Attention]["out"].apply(lambda lin: LoRA(lin, 2, jax.random.key(1)))


def test_summary_after_lora_counts_trainable_frozen_and_configuration_apart():
    model = Transformer(jax.random.key(0))
    lora = model.at[Attention]["out"].apply(lambda lin: LoRA(lin, 2, jax.random.key(1)), whole=True)
    lora = lora.at[Attention][re.compile("query|key|value")].apply(tc.freeze)
    adapters = 2 * (8 * 2 + 2 * 8)  # a and b of each of the two blocks
    assert sum(x.size for x, r in _with_roles(lora) if r == "trainable") == adapters
    frozen = 2 * 4 * (8 * 8 + 8)  # query, key, value and the base of out, per block
    table = tc.tree_summary(lora)
    assert f"│ {adapters:>5,} │" in _role_row(table, "trainable")
    assert f"│ {frozen:>5,} │" in _role_row(table, "frozen")
    assert f"│ {2 * 2:>5,} │" in _role_row(table, "other")  # heads and causal, per block
    total = [r for r in table.splitlines() if r.startswith("│ Σ") and "Transformer" in r]
    assert f"│ {adapters + frozen + 4:>5,} │" in total[0]


def _with_roles(tree):
    leaves = jax.tree.leaves(tree, is_leaf=tc.is_frozen)
    return list(zip(leaves, jax.tree.leaves(tc.roles(tree))))


def _role_row(table, role):
    (row,) = [r for r in table.splitlines() if r.startswith("│ Σ") and f" {role} " in r]
    return row


def test_summary_totals_each_role_and_the_static_configuration_apart():
    net = Net(jax.random.key(0)).at["out"]["bias"].apply(tc.freeze)
    table = tc.tree_summary({"net": net, "eps": 1e-5})
    assert "│ ['net'].out.bias   │ #f32[1]  │     1 │   4B │ frozen    │" in table
    assert "│ ['eps']            │ float    │     1 │  24B │ other     │" in table
    rows = {role: _role_row(table, role) for role in ("trainable", "state", "frozen", "other")}
    assert "│     9 │  36B │" in rows["trainable"]  # norm scale and bias, out weight
    assert "│     7 │  28B │" in rows["state"]  # mean, var and count
    assert "│     1 │   4B │" in rows["frozen"] and "│     1 │  24B │" in rows["other"]
    # the static fields: momentum and training of BatchNorm, rate and training of Dropout
    # (the layer's name, a string, counts no element), outside the total
    assert "│     4 │" in _role_row(table, "static")
    (total,) = [r for r in table.splitlines() if r.startswith("│ Σ") and " dict " in r]
    assert "│    18 │  92B │" in total


# -- apply on whole nodes, by every selector that can pick a node ---------------------------


def _to_lora(lin):
    return LoRA(lin, 2, jax.random.key(1))


@pytest.mark.parametrize(
    "where",
    [
        pytest.param((Attention, "out"), id="class then name"),
        pytest.param(("blocks", ..., "out"), id="names"),
        pytest.param((tc.glob("blocks.*.out"),), id="glob"),
        pytest.param(
            (tc.where(lambda path, n: isinstance(n, Linear) and path[-1].name == "out"),),
            id="where",
        ),
    ],
)
def test_apply_on_whole_nodes_by_every_selector_kind(where):
    model = Transformer(jax.random.key(0))
    indexer = model.at
    for selector in where:
        indexer = indexer[selector]
    lora = indexer.apply(_to_lora, whole=True)
    for old, new in zip(model.blocks, lora.blocks):
        assert isinstance(new.out, LoRA) and tc.is_tree_equal(tc.unfreeze(new.out.base), old.out)
        assert new.query is old.query and new.key is old.key and new.value is old.value
    assert tc.roles(lora).blocks[0].out.base == "frozen"


# -- freezing by an element mask --------------------------------------------------------------


def test_freezing_part_of_an_array_by_an_element_mask_is_an_error_naming_the_leaf():
    tree = {"w": jnp.arange(4.0)}
    with pytest.raises((TypeError, ValueError), match=r"(?s)tree\['w'\].*element"):
        tc.at(tree)[{"w": jnp.array([True, False, True, False])}].apply(tc.freeze)


# -- declaring roles: `tc.field(role=...)`, however `__init__` is written -----------------------


class HandBatchNorm(tc.TreeClass):
    """A batch norm as a PyTreeClass user writes it: a hand-written `__init__`."""

    running_mean: jax.Array = tc.field(role="state")
    running_var: jax.Array = tc.field(role="state")

    def __init__(self, n, momentum=0.9):
        self.weight = jnp.ones(n)
        self.bias = jnp.zeros(n)
        self.running_mean = jnp.zeros(n)
        self.running_var = jnp.ones(n)
        self.momentum = tc.freeze(momentum)

    def __call__(self, x):
        m = tc.unfreeze(self.momentum)
        mean, var = x.mean(0), x.var(0)
        new = self.replace(
            running_mean=m * self.running_mean + (1 - m) * mean,
            running_var=m * self.running_var + (1 - m) * var,
        )
        return (x - mean) / jnp.sqrt(var + 1e-5) * self.weight + self.bias, new


def test_role_keyword_is_the_metadata_role():
    class Generated(tc.TreeClass):
        w: jax.Array
        mean: jax.Array = tc.field(role="state")
        old: jax.Array = tc.field(metadata={"role": "state"})

    model = Generated(jnp.ones(2), jnp.zeros(2), jnp.zeros(2))
    assert jax.tree.leaves(tc.roles(model)) == ["trainable", "state", "state"]
    assert tc.fields(Generated)[1].metadata == {"role": "state"}


def test_roles_declared_in_the_class_body_hold_for_a_hand_written_init():
    assert tc.roles(HandBatchNorm(3)) == tc.roles(HandBatchNorm(3))
    roles = jax.tree.leaves(tc.roles(HandBatchNorm(3)))
    assert roles == ["trainable", "trainable", "state", "state", "frozen"]


def test_hand_written_batch_norm_statistics_come_only_from_the_forward_pass():
    net = HandBatchNorm(3)
    # a large decay and learning rate: any optimizer touch on the statistics would show
    opt = tc.optim.trainable(optax.adamw(0.5, weight_decay=0.9), net)
    rng = np.random.default_rng(0)
    batches = [jnp.asarray(rng.normal(2.0, 3.0, (16, 3)), jnp.float32) for _ in range(12)]

    @jax.jit
    def step(net, state, x):
        def loss(net):
            y, new = net(x)
            return jnp.mean((y - 1.0) ** 2), new

        grads, new = jax.grad(loss, has_aux=True)(net)
        updates, state = opt.update(grads, state, new)
        return tc.optim.apply_updates(new, updates), state

    state = opt.init(net)
    mean, var = np.zeros(3), np.ones(3)
    for x in batches:
        net, state = step(net, state, x)
        mean = 0.9 * mean + 0.1 * np.asarray(x).mean(0)
        var = 0.9 * var + 0.1 * np.asarray(x).var(0)
    assert np.allclose(net.running_mean, mean, rtol=1e-5)
    assert np.allclose(net.running_var, var, rtol=1e-5)
    assert not np.allclose(net.weight, 1.0)  # the parameters did train
    # the optimizer holds no state for the statistics
    assert len(jax.tree.leaves(state[0].mu)) == 2


def test_unknown_role_keyword_is_an_error_listing_the_roles():
    with pytest.raises(ValueError, match=r"(?s)`role` must be one of 'state', 'frozen'.*'param'"):
        tc.field(role="param")


def test_role_given_twice_differently_is_an_error():
    with pytest.raises(TypeError, match=r"role='state' and metadata role 'frozen'"):
        tc.field(role="state", metadata={"role": "frozen"})
    assert tc.field(role="state", metadata={"role": "state", "doc": 1}).metadata["doc"] == 1


# -- a field declared frozen: a traced leaf nothing trains ------------------------------------


class Adapter(tc.TreeClass):
    base: Linear = tc.field(role="frozen")
    a: jax.Array
    b: jax.Array

    def __call__(self, x):
        return jnp.tanh(self.base(x) + (x @ self.a) @ self.b)


def adapter(n, seed=0, r=2):
    rng = np.random.default_rng(seed)
    base = Linear(jnp.asarray(rng.normal(size=(n, n)), jnp.float32), jnp.zeros(n))
    return Adapter(base, jnp.asarray(rng.normal(size=(n, r)), jnp.float32), jnp.zeros((r, n)))


def _loss(model, x):
    return jnp.mean(model(x) ** 2)


def test_frozen_field_leaves_are_leaves_with_role_frozen():
    model = adapter(4)
    assert len(jax.tree.leaves(model)) == 4
    assert jax.tree.leaves(tc.roles(model)) == ["frozen", "frozen", "trainable", "trainable"]
    assert "frozen" in tc.tree_summary(model)


def test_frozen_field_gets_zero_gradient_without_computing_one():
    model = adapter(4)
    grads = jax.grad(_loss)(model, jnp.ones((3, 4)))
    assert not np.asarray(grads.base.weight).any() and not np.asarray(grads.base.bias).any()
    assert np.asarray(grads.b).any()
    jaxpr = jax.make_jaxpr(jax.grad(_loss))(model, jnp.ones((3, 4)))
    # forward: x @ W, x @ a, (x a) @ b; backward: d(x a), d(a), d(b), and nothing for W
    dots = [e for e in jaxpr.eqns if e.primitive.name == "dot_general"]
    assert len(dots) == 3 + 3
    assert all(e.outvars[0].aval.shape != (4, 4) for e in dots)  # no gradient of W


def test_frozen_field_reads_outside_a_trace_return_the_stored_value():
    model = adapter(4)
    assert model.base is tc.at(model)["base"].get().base


def test_frozen_field_has_no_optimizer_state_and_stays_bit_identical():
    model = adapter(4)
    opt = tc.optim.trainable(optax.adamw(0.1, weight_decay=0.5), model)
    state = opt.init(model)
    assert len(jax.tree.leaves(state[0].mu)) == 2
    step = jax.jit(
        lambda m, s, x: (
            lambda g: (lambda u, s: (tc.optim.apply_updates(m, u), s))(*opt.update(g, s, m))
        )(jax.grad(_loss)(m, x))
    )
    new, state = step(model, state, jnp.ones((3, 4)))
    assert same_bits(new.base, model.base) and not same_bits(new.a, model.a)


def test_frozen_field_new_values_of_the_same_shapes_do_not_recompile():
    traces = []

    @jax.jit
    def forward(model, x):
        traces.append(1)
        return _loss(model, x)

    x = jnp.ones((3, 8))
    for seed in range(3):
        forward(adapter(8, seed), x)
    assert len(traces) == 1
    lowered = forward.lower(adapter(8), x).as_text()
    constants = [line for line in lowered.splitlines() if "constant" in line and "8x8" in line]
    assert not constants  # the base is an argument, not a constant of the program


def test_frozen_field_arrays_are_freed_with_the_model():
    import gc
    import weakref

    @jax.jit
    def forward(model, x):
        return _loss(model, x)

    model = adapter(16, seed=3)
    forward(model, jnp.ones((2, 16))).block_until_ready()
    ref = weakref.ref(model.base.weight)
    del model
    gc.collect()
    assert ref() is None


def test_lora_adapter_with_a_frozen_field_stacks_and_trains_inside_a_stack():
    rng = np.random.default_rng(1)
    blocks = [adapter(4, seed) for seed in range(3)]
    stack = tc.Stacked.from_blocks(blocks)
    assert jax.tree.leaves(tc.roles(stack))[:2] == ["frozen", "frozen"]
    opt = tc.optim.trainable(optax.adam(0.1), stack)
    state = opt.init(stack)
    assert len(jax.tree.leaves(state[0].mu)) == 2
    x = jnp.asarray(rng.normal(size=(5, 4)), jnp.float32)
    grads = jax.jit(jax.grad(lambda s: jnp.mean(s(x) ** 2)))(stack)
    assert not np.asarray(grads.tree.base.weight).any()
    updates, state = opt.update(grads, state, stack)
    new = tc.optim.apply_updates(stack, updates)
    assert same_bits(new.tree.base, stack.tree.base) and not same_bits(new.tree.b, stack.tree.b)


def test_frozen_subtree_in_a_stack_names_the_frozen_field_as_the_fix():
    class FrozenBase(tc.TreeClass):
        def __init__(self, base):
            self.base = tc.freeze(base)

    blocks = [FrozenBase(adapter(4, seed).base) for seed in range(2)]
    with pytest.raises(ValueError, match=r"(?s)frozen subtree.*tc\.field\(role=\"frozen\"\)"):
        tc.Stacked.from_blocks(blocks)


def test_a_stack_keeps_no_copy_of_its_frozen_base_for_the_backward_pass():
    stack = tc.Stacked.from_blocks([adapter(4, seed) for seed in range(3)])
    x = jnp.ones((5, 4))
    jaxpr = jax.make_jaxpr(jax.grad(lambda s: jnp.mean(s(x) ** 2)))(stack).jaxpr
    scans = [e for e in jaxpr.eqns if e.primitive.name == "scan"]
    shapes = [v.aval.shape for e in scans for v in e.outvars]
    # the forward scan would save the (3, 4, 4) base weights as residuals, had the block's
    # read stopped their gradient anew inside the body
    assert scans and stack.tree.base.weight.shape not in shapes


# -- a declared role outranks a selection ------------------------------------------------------


def _lora():
    return tc.nn.LoRA(tc.nn.Linear(8, 4, key=jax.random.key(0)), rank=2, key=jax.random.key(1))


@pytest.mark.parametrize(
    "selector", [..., tc.nn.Linear, tc.glob("**.weight")], ids=["ellipsis", "class", "glob"]
)
@pytest.mark.parametrize(
    "make",
    [
        lambda: optax.adamw(0.1, weight_decay=0.5),
        lambda: optax.adam(0.1),
        lambda: optax.sgd(0.1, momentum=0.9),
    ],
    ids=["adamw", "adam", "sgd+momentum"],
)
def test_a_selection_never_trains_a_lora_base_nor_keeps_state_for_it(selector, make):
    lora = _lora()
    opt = tc.optim.trainable(make(), lora.at[selector])
    state = opt.init(lora)
    assert (4, 8) not in {np.shape(x) for x in jax.tree.leaves(state)}
    x = jnp.ones((3, 8))
    model = lora
    for _ in range(2):
        grads = jax.grad(lambda m: jnp.sum(m(x) ** 2))(model)
        updates, state = opt.update(grads, state, model)
        model = tc.optim.apply_updates(model, updates)
    assert same_bits(model.base_layer, lora.base_layer)
    assert not same_bits(model.lora_B.weight, lora.lora_B.weight)


def test_summary_roles_and_masks_agree_on_what_a_lora_selection_trains():
    lora = _lora()
    roles = jax.tree.leaves(tc.roles(lora))
    picked = jax.tree.leaves(tc.optim.mask(lora.at[...]))
    assert [role == "trainable" for role in roles] == picked


# -- gradients without the frozen base: tc.optim.split / merge ---------------------------------


def _train_adapter(model, gradient, steps=3):
    opt = tc.optim.trainable(optax.adamw(0.1, weight_decay=0.5), model)
    state = opt.init(model)
    for _ in range(steps):
        updates, state = opt.update(gradient(model), state, model)
        model = tc.optim.apply_updates(model, updates)
    return model


def test_gradient_of_the_split_trained_part_holds_no_array_for_a_frozen_base():
    model, x = adapter(8), jnp.ones((3, 8))

    @jax.jit
    def gradient(params, rest):
        return jax.grad(lambda p: _loss(tc.optim.merge(p, rest), x))(params)

    params, rest = tc.optim.split(model)
    grads = gradient(params, rest)
    assert grads.base.weight is None and grads.base.bias is None
    assert {np.shape(g) for g in jax.tree.leaves(grads)} == {(8, 2), (2, 8)}
    # the values of the whole model's gradient, for the trained leaves (another program:
    # equal up to rounding; `_train_adapter` below compares bits, eagerly)
    full = jax.jit(jax.grad(_loss))(model, x)
    np.testing.assert_allclose(grads.a, full.a, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(grads.b, full.b, rtol=1e-6, atol=1e-7)


def test_training_on_split_gradients_gives_the_model_that_whole_gradients_give():
    x = jnp.ones((3, 8))

    def whole(model):
        return jax.grad(_loss)(model, x)

    def parted(model):
        params, rest = tc.optim.split(model)
        return jax.grad(lambda p: _loss(tc.optim.merge(p, rest), x))(params)

    a, b = _train_adapter(adapter(8), whole), _train_adapter(adapter(8), parted)
    assert same_bits(a, b) and jax.tree.structure(a) == jax.tree.structure(b)
    assert same_bits(b.base, adapter(8).base)


def test_updates_of_a_split_gradient_hold_nothing_where_the_gradient_holds_nothing():
    model = adapter(8)
    params, rest = tc.optim.split(model)
    grads = jax.grad(lambda p: _loss(tc.optim.merge(p, rest), jnp.ones((3, 8))))(params)
    opt = tc.optim.trainable(optax.adamw(0.1, weight_decay=0.5), model)
    updates, _ = opt.update(grads, opt.init(model), model)
    assert updates.base.weight is None
    # `init` takes the trained part as well as the model
    assert same_bits(opt.init(params), opt.init(model))


def test_a_split_gradient_missing_a_trained_leaf_is_an_error_naming_it():
    model = adapter(4)
    opt = tc.optim.trainable(optax.adam(0.1), model)
    params, _ = tc.optim.split(model.at["b"])
    with pytest.raises(ValueError, match=r"(?s)`None` at `Adapter\.a`.*split the model with"):
        opt.update(params, opt.init(model), model)


@settings(max_examples=15, deadline=None)
@given(
    st.sampled_from(["model", "ellipsis", "union", "one leaf"]),
    st.booleans(),
    st.integers(0, 2**16),
)
def test_merge_of_split_gives_the_model_back(kind, freeze_b, seed):
    model = adapter(3, seed)
    if freeze_b:
        model = model.at["b"].apply(tc.freeze)
    selection = {
        "model": model,
        "ellipsis": model.at[...],
        "union": model.at[("base", "a")],
        "one leaf": model.at["a"],
    }[kind]
    params, rest = tc.optim.split(selection)
    merged = tc.optim.merge(params, rest)
    assert jax.tree.structure(merged, is_leaf=tc.is_frozen) == jax.tree.structure(
        model, is_leaf=tc.is_frozen
    )
    assert same_bits(merged, model) and tc.is_tree_equal(merged, model)
    assert params.base.weight is None  # a frozen field is never in the trained part


def test_merge_names_where_the_parts_do_not_fit_or_overlap():
    model = adapter(4)
    params, rest = tc.optim.split(model)
    with pytest.raises(ValueError, match=r"value in both parts at `Adapter\.a`"):
        tc.optim.merge(params, model)
    with pytest.raises(ValueError, match=r"part ways at `Adapter`"):
        tc.optim.merge(params, {"a": 1})
