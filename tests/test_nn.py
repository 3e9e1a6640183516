"""`treeclass.nn` as treeclass sees it: roles, modes, stacks, printing, layouts, errors,
and property tests for shapes. Numerics against equinox and flax: test_nn_anchors.py."""

from __future__ import annotations

import inspect
import pathlib
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import treeclass as tc

nn = tc.nn
KEY = jax.random.key(0)
ROOT = pathlib.Path(__file__).resolve().parents[1]


# -- the package ----------------------------------------------------------------------------


def test_nn_loads_on_first_use_only():
    import subprocess

    code = "import sys, treeclass as tc; a = 'treeclass.nn' in sys.modules; tc.nn; print(a)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"
    assert tc.nn is sys.modules["treeclass.nn"]


@pytest.mark.parametrize("name", nn.__all__)
def test_every_layer_has_an_api_entry_and_a_runnable_docstring_example(name):
    page = (ROOT / "docs" / "api" / "nn.md").read_text()
    assert f"::: treeclass.nn.{name}\n" in page
    doc = inspect.getdoc(getattr(nn, name))
    examples = re.findall(r"^```python\n(.*?)^```", doc, re.MULTILINE | re.DOTALL)
    assert examples, f"{name} has no example"
    for code in examples:
        exec(compile(code, f"<{name} docstring>", "exec"), {"__name__": "docstring"})


# -- roles, state, optimizer ----------------------------------------------------------------


def test_batch_norm_statistics_are_state_and_the_optimizer_never_touches_them():
    norm = nn.BatchNorm(3)
    assert jax.tree.leaves(tc.roles(norm)) == ["trainable", "trainable", "state", "state"]
    opt = tc.optim.trainable(optax.adamw(0.1, weight_decay=0.5), norm)
    grads = jax.tree.map(jnp.ones_like, norm)
    updates, _ = opt.update(grads, opt.init(norm), norm)
    after = optax.apply_updates(norm, updates)
    assert (after.running_mean == norm.running_mean).all()
    assert (after.running_var == norm.running_var).all()
    assert not (after.weight == norm.weight).all()


def test_a_direct_training_call_of_batch_norm_names_both_fixes_and_changes_nothing():
    norm = nn.BatchNorm(2)
    with pytest.raises(AttributeError, match="tc.value_and_tree") as error:
        norm(jnp.ones((3, 2)))
    assert "set_training" in str(error.value)
    assert (norm.running_mean == 0).all()


def test_batch_norm_updates_every_layer_of_a_model_through_value_and_tree():
    model = nn.Sequential(nn.Linear(2, 3, key=KEY), nn.BatchNorm(3), nn.BatchNorm(3))
    x = jax.random.normal(KEY, (8, 2))
    y, new = jax.jit(tc.value_and_tree(lambda m, x: m(x)))(model, x)
    assert y.shape == (8, 3)
    assert (new[1].running_mean != 0).any() and (new[2].running_var != 1).any()
    assert (model[1].running_mean == 0).all()  # the input is unchanged


# -- modes ----------------------------------------------------------------------------------


class _Block(tc.TreeClass):
    """A user block with a mode of its own, holding a dropout."""

    training: bool = tc.field(default=True, static=True)

    def __init__(self):
        self.training = True
        self.drop = nn.Dropout(0.5)
        self.norm = nn.BatchNorm(2)


def test_set_training_switches_every_mode_at_any_depth_including_user_classes():
    model = {"blocks": [_Block(), _Block()], "head": nn.Linear(2, 2, key=KEY)}
    evaluating = nn.set_training(model, False)
    for block in evaluating["blocks"]:
        assert block.training is False and block.drop.training is False
        assert block.norm.training is False
    assert model["blocks"][0].drop.training is True
    back = nn.set_training(evaluating, True)
    assert tc.is_tree_equal(back, model)


def test_set_training_leaves_a_tree_without_modes_unchanged_and_refuses_a_non_bool():
    layer = nn.Linear(2, 2, key=KEY)
    assert nn.set_training(layer, False) is layer or tc.is_tree_equal(
        nn.set_training(layer, False), layer
    )
    with pytest.raises(TypeError, match="takes a bool"):
        nn.set_training(layer, 0)


def test_switching_modes_back_and_forth_compiles_each_mode_once():
    traces = []

    @jax.jit
    def forward(model, x, key):
        traces.append(model[1].training)
        return model(x, key=key)

    model = nn.Sequential(nn.Linear(4, 4, key=KEY), nn.Dropout(0.5))
    x = jnp.ones((2, 4))
    for _ in range(3):
        forward(model, x, KEY)
        forward(nn.set_training(model, False), x, KEY)
        model = nn.set_training(nn.set_training(model, False), True)
    assert traces == [True, False]


def test_set_training_switches_layers_inside_stacked_blocks():
    stack = tc.Stacked.from_init(
        lambda k: nn.Sequential(nn.Linear(2, 2, key=k), nn.Dropout(0.2)),
        jax.random.split(KEY, 3),
    )
    evaluating = nn.set_training(stack, False)
    assert all(block[1].training is False for block in evaluating)
    x = jnp.ones((1, 2))
    assert (evaluating(x) == evaluating(x)).all()


def test_dropout_in_training_without_a_key_is_an_error_naming_the_fix():
    with pytest.raises(ValueError, match="key=key"):
        nn.Dropout(0.1)(jnp.ones(3))
    assert (nn.Dropout(0.0)(jnp.ones(3)) == 1).all()  # a zero rate needs none
    with pytest.raises(ValueError, match=r"in \[0, 1\)"):
        nn.Dropout(1.0)


# -- stacks ---------------------------------------------------------------------------------


class GPTBlock(nn.Layer):
    def __init__(self, key, features=16, heads=4):
        k1, k2 = jax.random.split(key)
        self.ln_1 = nn.LayerNorm(features)
        self.attn = nn.MultiHeadAttention(
            features, heads, num_kv_heads=2, causal=True, rope_theta=10_000.0, key=k1
        )
        self.ln_2 = nn.RMSNorm(features)
        self.mlp = nn.MLP(features, features, 2 * features, 1, activation=jax.nn.gelu, key=k2)

    def __call__(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


def test_a_stacked_transformer_block_equals_the_blocks_applied_in_turn():
    keys = jax.random.split(KEY, 3)
    stack = tc.Stacked.from_init(GPTBlock, keys)
    blocks = tuple(GPTBlock(k) for k in keys)
    x = jax.random.normal(jax.random.key(1), (2, 5, 16))

    def unrolled(blocks, x):
        for block in blocks:
            x = block(x)
        return x

    # (jitted: op by op, the unrolled blocks and their gradient compile every operation)
    np.testing.assert_allclose(stack(x), jax.jit(unrolled)(blocks, x), rtol=1e-5, atol=1e-5)
    grads = jax.jit(jax.grad(lambda s: jnp.sum(s(x) ** 2)))(stack)
    grads_unrolled = jax.jit(jax.grad(lambda b: jnp.sum(unrolled(b, x) ** 2)))(blocks)
    np.testing.assert_allclose(
        grads.tree.attn.q_proj.weight[2],
        grads_unrolled[2].attn.q_proj.weight,
        rtol=1e-4,
        atol=1e-4,
    )
    edited = tc.at(stack)[2]["attn"]["o_proj"]["weight"].set(0.0)
    zeroed = [not block.attn.o_proj.weight.any() for block in edited]
    assert zeroed == [False, False, True]


def test_lora_adapters_fit_inside_stacked_blocks_and_merge_back():
    stack = tc.Stacked.from_init(GPTBlock, jax.random.split(KEY, 2))
    tuned = tc.at(stack)[...]["attn"]["q_proj"].apply(
        lambda linear: nn.LoRA(linear, 2, key=KEY), whole=True
    )
    x = jnp.ones((1, 3, 16))
    np.testing.assert_allclose(tuned(x), stack(x), rtol=1e-6)
    merged = tc.at(tuned)[nn.LoRA].apply(lambda adapter: adapter.merge(), whole=True)
    assert type(merged.tree.attn.q_proj) is nn.Linear


# -- printing and layouts -------------------------------------------------------------------


def test_printing_shows_configuration_only_where_it_differs_from_the_default():
    conv = nn.Conv(2, 4, (3, 3), stride=2, key=KEY)
    text = repr(conv)
    assert text.startswith("Conv[stride=(2, 2)](") and "padding" not in text
    assert "dilation" not in text and "groups" not in text
    assert repr(nn.Dropout(0.5)) == "Dropout()"
    assert repr(nn.set_training(nn.Dropout(0.1), False)) == "Dropout[rate=0.1, training=False]()"
    assert "MLP[activation=gelu]" in repr(nn.MLP(2, 2, 2, 1, activation=jax.nn.gelu, key=KEY))


def test_the_summary_rows_are_the_leaves_with_their_roles():
    summary = tc.tree_summary(
        nn.Sequential(nn.Conv(2, 2, (1,), stride=2, key=KEY), nn.BatchNorm(2))
    )
    assert ".layers[1].running_mean" in summary and "stride" not in summary
    assert "state" in summary


def test_parameter_names_and_orientations_are_pytorch_and_hugging_face_s():
    def names(tree):
        return {
            jax.tree_util.keystr(p, simple=True, separator="."): leaf.shape
            for p, leaf in jax.tree_util.tree_leaves_with_path(tree)
        }

    assert names(nn.Linear(3, 5, key=KEY)) == {"weight": (5, 3), "bias": (5,)}
    assert names(nn.Conv(4, 6, (3, 2), groups=2, key=KEY)) == {
        "weight": (6, 2, 3, 2),
        "bias": (6,),
    }
    assert names(nn.Embed(7, 3, key=KEY)) == {"weight": (7, 3)}
    assert set(names(nn.BatchNorm(2))) == {"weight", "bias", "running_mean", "running_var"}
    lora = nn.LoRA(nn.Linear(6, 4, key=KEY), 2, key=KEY)
    assert names(lora) == {
        "base_layer.weight": (4, 6),
        "base_layer.bias": (4,),
        "lora_A.weight": (2, 6),
        "lora_B.weight": (4, 2),
    }


def test_layers_save_and_load_under_those_names(tmp_path):
    model = nn.Sequential(nn.Linear(3, 4, key=KEY), nn.BatchNorm(4))
    path = tmp_path / "model.safetensors"
    tc.save(path, model)
    restored = tc.load(path, nn.Sequential(nn.Linear(3, 4, key=jax.random.key(9)), nn.BatchNorm(4)))
    assert tc.is_tree_equal(restored, model)


# -- errors ---------------------------------------------------------------------------------


def test_constructors_name_what_is_wrong():
    # sizes, strides, heads and rates: test_nn_checks.py
    with pytest.raises(TypeError, match="needs `key=`"):
        nn.Linear(2, 3, key=None)
    with pytest.raises(TypeError, match="floating dtype"):
        nn.Linear(2, 2, dtype=jnp.int32, key=KEY)
    with pytest.raises(TypeError, match="wraps a `tc.nn.Linear`"):
        nn.LoRA(nn.LayerNorm(2), 1, key=KEY)
    with pytest.raises(TypeError, match="not callable"):
        nn.Sequential(nn.Linear(2, 2, key=KEY), 3)


def test_embed_names_ids_that_are_not_integers():
    with pytest.raises(TypeError, match="integer token ids"):
        nn.Embed(4, 2, key=KEY)(jnp.ones(3))


# -- property tests: shapes -----------------------------------------------------------------

batch_shapes = st.lists(st.integers(1, 3), max_size=2).map(tuple)


@settings(max_examples=20, deadline=None)
@given(batch=batch_shapes, fin=st.integers(1, 5), fout=st.integers(1, 5), bias=st.booleans())
def test_linear_maps_the_last_axis_and_keeps_the_batch_axes(batch, fin, fout, bias):
    # traced, not run: the shapes are what is checked, and tracing compiles nothing
    x = jax.ShapeDtypeStruct((*batch, fin), jnp.float32)
    out = jax.eval_shape(lambda x: nn.Linear(fin, fout, use_bias=bias, key=KEY)(x), x)
    assert out.shape == (*batch, fout)


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 3),
    size=st.integers(4, 7),
    kernel=st.integers(1, 3),
    stride=st.integers(1, 2),
    dilation=st.integers(1, 2),
    padding=st.sampled_from([0, 1, "SAME", "VALID"]),
    batch=batch_shapes,
)
def test_conv_output_size_follows_the_convolution_arithmetic(
    n, size, kernel, stride, dilation, padding, batch
):
    def apply(x):  # traced, not run (see the Linear shapes)
        kernels = (kernel,) * n
        conv = nn.Conv(2, 3, kernels, stride=stride, dilation=dilation, padding=padding, key=KEY)
        return conv(x)

    out = jax.eval_shape(apply, jax.ShapeDtypeStruct((*batch, *(size,) * n, 2), jnp.float32))
    span = dilation * (kernel - 1) + 1
    if padding == "SAME":
        expected = -(-size // stride)
    else:
        pad = 0 if padding == "VALID" else 2 * padding
        expected = (size + pad - span) // stride + 1
    assert out.shape == (*batch, *(expected,) * n, 3)


@settings(max_examples=15, deadline=None)
@given(
    batch=batch_shapes,
    seq=st.integers(1, 4),
    kv_seq=st.integers(1, 4),
    kv_heads=st.sampled_from([1, 2, 4]),
    cross=st.booleans(),
)
def test_attention_keeps_the_query_shape(batch, seq, kv_seq, kv_heads, cross):
    def apply(x, context):  # traced, not run (see the Linear shapes)
        attention = nn.MultiHeadAttention(
            8, 4, num_kv_heads=kv_heads, kv_features=6 if cross else None, rope_theta=100.0, key=KEY
        )
        return attention(x, context)

    x = jax.ShapeDtypeStruct((*batch, seq, 8), jnp.float32)
    context = jax.ShapeDtypeStruct((*batch, kv_seq, 6), jnp.float32) if cross else None
    assert jax.eval_shape(apply, x, context).shape == (*batch, seq, 8)


@settings(max_examples=15, deadline=None)
@given(ids=st.lists(st.integers(0, 9), min_size=1, max_size=4), batch=batch_shapes)
def test_embed_appends_the_feature_axis(ids, batch):
    table = nn.Embed(10, 3, key=KEY)
    tokens = jnp.broadcast_to(jnp.array(ids), (*batch, len(ids)))
    assert table(tokens).shape == (*batch, len(ids), 3)
    np.testing.assert_array_equal(
        table(tokens).reshape(-1, len(ids), 3)[0, 0], table.weight[ids[0]]
    )


def test_attention_and_mlp_name_their_products_for_a_rematerialisation_policy():
    # a stack's `scan(remat=save_only_these_names(...))` keeps exactly the named products
    # of each block (the scan gap's best policy on a TPU) and recomputes the rest
    import contextlib
    import io

    keys = jax.random.split(jax.random.key(0), 3)
    stack = tc.Stacked.from_blocks([nn.DecoderBlock(8, 2, 16, key=k) for k in keys])
    x = jnp.ones((1, 4, 8))
    names = {"query", "key", "value", "attended", "up", "gate"}
    jaxpr = str(jax.make_jaxpr(lambda h: stack.unstack()[0](h))(x))
    assert set(re.findall(r"\bname\[name=(\w+)\]", jaxpr)) == names

    def loss(s, remat):
        return jnp.sum(s.scan(lambda b, h: (b(h), None), x, remat=remat)[0] ** 2)

    def saved_by_scan(remat):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            jax.ad_checkpoint.print_saved_residuals(lambda s: loss(s, remat), stack)
        return out.getvalue().count("output of scan")

    policy = jax.checkpoint_policies.save_only_these_names(*names)
    # the carry, and one array per named product (query, key, value, attended: width 8;
    # up and gate: width 16)
    assert saved_by_scan(policy) == 1 + len(names)
    assert saved_by_scan(True) == 1  # everything recomputed
    want = jax.grad(loss)(stack, False)
    got = jax.grad(loss)(stack, policy)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
