"""Each layer of `treeclass.nn` computes what equinox's or flax nnx's equivalent computes.

Same key, same initial weights (where the layer follows equinox's initialisers); same
weights, same outputs and gradients to float tolerance, masks and modes included.
Equinox layers take one example (no batch axis) and channels first: they are vmapped
and transposed here.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import reference_tol

import treeclass as tc

eqx = pytest.importorskip("equinox")
nnx = pytest.importorskip("flax.nnx")

TOL = reference_tol()
pytestmark = pytest.mark.usefixtures("highest_precision")
KEY = jax.random.key(0)


def _normal(seed, shape):
    return jax.random.normal(jax.random.key(seed), shape)


def _close(a, b, **tol):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), **(tol or TOL))


def _trees_close(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        _close(x, y)


# -- Linear, Embed --------------------------------------------------------------------------


def test_linear_draws_equinox_weights_and_matches_its_output_and_gradients():
    ours = tc.nn.Linear(5, 3, key=KEY)
    theirs = eqx.nn.Linear(5, 3, key=KEY)
    assert (ours.weight == theirs.weight).all() and (ours.bias == theirs.bias).all()
    x = _normal(1, (4, 5))
    _close(ours(x), jax.vmap(theirs)(x))
    g_ours = jax.grad(lambda m: jnp.sum(m(x) ** 2))(ours)
    g_theirs = jax.grad(lambda m: jnp.sum(jax.vmap(m)(x) ** 2))(theirs)
    _close(g_ours.weight, g_theirs.weight)
    _close(g_ours.bias, g_theirs.bias)


def test_linear_without_bias_matches_equinox():
    ours = tc.nn.Linear(5, 3, use_bias=False, key=KEY)
    theirs = eqx.nn.Linear(5, 3, use_bias=False, key=KEY)
    assert ours.bias is None
    _close(ours(_normal(1, (5,))), theirs(_normal(1, (5,))))


def test_linear_bf16_compute_matches_nnx_with_float32_parameters():
    ours = tc.nn.Linear(8, 4, dtype=jnp.bfloat16, key=KEY)
    theirs = nnx.Linear(8, 4, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    theirs.kernel[...] = ours.weight.T
    theirs.bias[...] = ours.bias
    x = _normal(1, (2, 8))
    y = ours(x)
    assert y.dtype == jnp.bfloat16 and ours.weight.dtype == jnp.float32
    _close(y.astype(jnp.float32), theirs(x).astype(jnp.float32), rtol=1e-2, atol=1e-2)


def test_linear_param_dtype_creates_bf16_parameters():
    layer = tc.nn.Linear(4, 2, param_dtype=jnp.bfloat16, key=KEY)
    assert layer.weight.dtype == jnp.bfloat16 and layer.bias.dtype == jnp.bfloat16


def test_embed_draws_equinox_table_and_attend_matches_nnx():
    ours = tc.nn.Embed(10, 4, key=KEY)
    theirs = eqx.nn.Embedding(10, 4, key=KEY)
    assert (ours.weight == theirs.weight).all()
    ids = jnp.array([[0, 3], [9, 3]])
    _close(ours(ids), jax.vmap(jax.vmap(theirs))(ids))
    flax_embed = nnx.Embed(10, 4, rngs=nnx.Rngs(0))
    flax_embed.embedding[...] = ours.weight
    x = _normal(2, (3, 4))
    _close(ours.attend(x), flax_embed.attend(x))


# -- norms ----------------------------------------------------------------------------------


def _with_affine(layer, features):
    return layer.replace(weight=_normal(5, (features,)) + 1.0).replace(
        **({"bias": _normal(6, (features,))} if layer.bias is not None else {})
    )


def test_layer_norm_matches_equinox_and_nnx_outputs_and_gradients():
    ours = _with_affine(tc.nn.LayerNorm(6), 6)
    theirs = eqx.nn.LayerNorm(6)
    theirs = eqx.tree_at(lambda m: (m.weight, m.bias), theirs, (ours.weight, ours.bias))
    x = _normal(1, (3, 4, 6)) * 3 + 1
    _close(ours(x), jax.vmap(jax.vmap(theirs))(x))
    flax_norm = nnx.LayerNorm(6, epsilon=1e-5, rngs=nnx.Rngs(0))
    flax_norm.scale[...], flax_norm.bias[...] = ours.weight, ours.bias
    _close(ours(x), flax_norm(x))
    g_ours = jax.grad(lambda m: jnp.sum(jnp.sin(m(x))))(ours)
    g_theirs = jax.grad(lambda m: jnp.sum(jnp.sin(jax.vmap(jax.vmap(m))(x))))(theirs)
    _close(g_ours.weight, g_theirs.weight)
    _close(g_ours.bias, g_theirs.bias)
    x_grad = jax.grad(lambda x: jnp.sum(jnp.sin(ours(x))))(x)
    _close(x_grad, jax.grad(lambda x: jnp.sum(jnp.sin(flax_norm(x))))(x), rtol=1e-4, atol=1e-4)


def test_rms_norm_matches_equinox_and_nnx():
    ours = _with_affine(tc.nn.RMSNorm(6), 6)
    theirs = eqx.nn.RMSNorm(6, use_bias=False)
    theirs = eqx.tree_at(lambda m: m.weight, theirs, ours.weight)
    x = _normal(1, (5, 6)) * 2
    _close(ours(x), jax.vmap(theirs)(x))
    flax_norm = nnx.RMSNorm(6, epsilon=1e-5, rngs=nnx.Rngs(0))
    flax_norm.scale[...] = ours.weight
    _close(ours(x), flax_norm(x))
    g_ours = jax.grad(lambda m: jnp.sum(jnp.cos(m(x))))(ours)
    g_theirs = jax.grad(lambda m: jnp.sum(jnp.cos(jax.vmap(m)(x))))(theirs)
    _close(g_ours.weight, g_theirs.weight)


def test_norms_compute_statistics_in_float32_for_bf16_inputs():
    x = (_normal(1, (4, 64)) * 100 + 1000).astype(jnp.bfloat16)
    for norm in (tc.nn.LayerNorm(64), tc.nn.RMSNorm(64)):
        reference = norm(x.astype(jnp.float32))
        got = norm.replace(dtype=jnp.bfloat16)(x)
        assert got.dtype == jnp.bfloat16
        _close(got.astype(jnp.float32), reference, rtol=2e-2, atol=2e-2)


# -- BatchNorm ------------------------------------------------------------------------------


def _flax_batch_norm(ours, training):
    theirs = nnx.BatchNorm(ours.weight.shape[0], use_running_average=not training, rngs=nnx.Rngs(0))
    theirs.scale[...], theirs.bias[...] = ours.weight, ours.bias
    theirs.mean[...], theirs.var[...] = ours.running_mean, ours.running_var
    return theirs


def test_batch_norm_training_steps_match_nnx_outputs_and_running_statistics():
    ours = _with_affine(tc.nn.BatchNorm(3), 3)
    theirs = _flax_batch_norm(ours, training=True)
    for seed in range(3):
        x = _normal(seed, (8, 5, 3)) * 2 + seed
        y, ours = tc.value_and_tree(lambda m, x: m(x))(ours, x)
        _close(y, theirs(x))
        _close(ours.running_mean, theirs.mean[...])
        _close(ours.running_var, theirs.var[...])


def test_batch_norm_inference_matches_nnx_and_changes_nothing():
    ours = _with_affine(tc.nn.BatchNorm(3), 3)
    ours = ours.replace(running_mean=_normal(7, (3,)), running_var=jnp.exp(_normal(8, (3,))))
    evaluating = tc.nn.set_training(ours, False)
    x = _normal(1, (4, 3))
    _close(evaluating(x), _flax_batch_norm(ours, training=False)(x))
    _, after = tc.value_and_tree(lambda m: m(x))(evaluating)
    assert tc.is_tree_equal(after, evaluating)


def test_batch_norm_gradients_match_nnx():
    ours = _with_affine(tc.nn.BatchNorm(3), 3)
    x = _normal(1, (6, 3)) * 2

    def loss(m):
        y, _ = tc.value_and_tree(lambda m: m(x))(m)
        return jnp.sum(jnp.sin(y))

    grads = jax.grad(loss)(ours)
    theirs = _flax_batch_norm(ours, training=True)
    flax_grads = nnx.grad(lambda m: jnp.sum(jnp.sin(m(x))))(theirs)
    _close(grads.weight, flax_grads["scale"][...])
    _close(grads.bias, flax_grads["bias"][...])


def test_batch_norm_axis_name_averages_the_statistics_over_a_named_axis():
    norm = tc.nn.BatchNorm(3, axis_name="devices")
    x = _normal(1, (4, 5, 3))  # 4 "devices" of 5 rows

    def shard(x):
        return tc.value_and_tree(lambda m: m(x))(norm)

    ys, after = jax.vmap(shard, axis_name="devices", out_axes=(0, None))(x)
    y_whole, whole = tc.value_and_tree(lambda m: m(x.reshape(20, 3)))(norm.replace(axis_name=None))
    _close(ys.reshape(20, 3), y_whole)
    _close(after.running_var, whole.running_var)


# -- Conv -----------------------------------------------------------------------------------

CONV_CASES = [
    dict(kernel_size=(3,), stride=1, padding=0, dilation=1, groups=1),
    dict(kernel_size=(4,), stride=2, padding=((2, 1),), dilation=1, groups=2),
    dict(kernel_size=(3, 3), stride=1, padding=1, dilation=1, groups=1),
    dict(kernel_size=(3, 2), stride=(2, 1), padding="SAME", dilation=(1, 2), groups=1),
    dict(kernel_size=(3, 3), stride=1, padding="VALID", dilation=1, groups=4),
    dict(kernel_size=(2, 2, 2), stride=1, padding=1, dilation=1, groups=1),
    dict(kernel_size=(3, 1, 2), stride=(1, 2, 1), padding=0, dilation=(2, 1, 1), groups=2),
]


@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: str(c))
def test_conv_draws_equinox_weights_and_matches_its_output_and_gradients(case):
    n = len(case["kernel_size"])
    ours = tc.nn.Conv(4, 8, key=KEY, **case)
    theirs = eqx.nn.Conv(n, 4, 8, key=KEY, **case)
    assert ours.weight.shape == theirs.weight.shape
    assert (ours.weight == theirs.weight).all()
    assert (ours.bias == theirs.bias.reshape(-1)).all()
    spatial = (7, 6, 5)[:n]
    x = _normal(1, (2, *spatial, 4))

    def eqx_out(m, x):
        return jnp.moveaxis(jax.vmap(m)(jnp.moveaxis(x, -1, 1)), 1, -1)

    _close(ours(x), eqx_out(theirs, x))
    g_ours = jax.grad(lambda m: jnp.sum(m(x) ** 2))(ours)
    g_theirs = jax.grad(lambda m: jnp.sum(eqx_out(m, x) ** 2))(theirs)
    _close(g_ours.weight, g_theirs.weight, rtol=1e-4, atol=1e-4)
    _close(g_ours.bias, g_theirs.bias.reshape(-1), rtol=1e-4, atol=1e-4)


def test_conv_matches_nnx_channels_last_with_its_kernel_layout():
    ours = tc.nn.Conv(4, 6, (3, 3), stride=2, padding="SAME", groups=2, key=KEY)
    theirs = nnx.Conv(
        4, 6, (3, 3), strides=2, padding="SAME", feature_group_count=2, rngs=nnx.Rngs(0)
    )
    theirs.kernel[...] = jnp.transpose(ours.weight, (2, 3, 1, 0))  # [*k, in/groups, out]
    theirs.bias[...] = ours.bias
    x = _normal(1, (2, 9, 8, 4))
    _close(ours(x), theirs(x))


def test_conv_takes_an_unbatched_input_and_several_batch_axes():
    conv = tc.nn.Conv(2, 3, (3,), padding=1, key=KEY)
    x = _normal(1, (2, 5, 7, 2))
    batched = conv(x)
    assert batched.shape == (2, 5, 7, 3)
    _close(conv(x[1, 2]), batched[1, 2])


# -- Dropout --------------------------------------------------------------------------------


def test_dropout_drops_what_equinox_drops_with_the_same_key():
    x = _normal(1, (50,))
    ours = tc.nn.Dropout(0.3)(x, key=KEY)
    theirs = eqx.nn.Dropout(0.3)(x, key=KEY)
    _close(ours, theirs)
    evaluating = tc.nn.set_training(tc.nn.Dropout(0.3), False)
    assert (evaluating(x, key=KEY) == x).all() and (evaluating(x) == x).all()


# -- MultiHeadAttention ---------------------------------------------------------------------


def test_attention_draws_equinox_weights_and_matches_its_output_with_a_mask():
    ours = tc.nn.MultiHeadAttention(16, 4, key=KEY)
    theirs = eqx.nn.MultiheadAttention(4, 16, key=KEY)
    for a, b in [
        ("q_proj", "query_proj"),
        ("k_proj", "key_proj"),
        ("v_proj", "value_proj"),
        ("o_proj", "output_proj"),
    ]:
        assert (getattr(ours, a).weight == getattr(theirs, b).weight).all()
    x = _normal(1, (2, 6, 16))
    _close(ours(x), jax.vmap(lambda x: theirs(x, x, x))(x))
    mask = jax.random.bernoulli(jax.random.key(3), 0.7, (2, 6, 6)).at[..., 0].set(True)
    _close(ours(x, mask=mask[:, None]), jax.vmap(lambda x, m: theirs(x, x, x, mask=m))(x, mask))


def test_causal_attention_and_padding_match_equinox_with_the_combined_mask():
    ours = tc.nn.MultiHeadAttention(16, 4, causal=True, key=KEY)
    theirs = eqx.nn.MultiheadAttention(4, 16, key=KEY)
    x = _normal(1, (2, 5, 16))
    valid = jnp.arange(5) < jnp.array([[5], [3]])
    padding = valid[:, None, None, :]
    causal = jnp.tril(jnp.ones((5, 5), bool))
    expected = jax.vmap(lambda x, v: theirs(x, x, x, mask=causal & v[None, :]))(x, valid)
    _close(ours(x, mask=padding), expected)
    g_ours = jax.grad(lambda m: jnp.sum(m(x, mask=padding) ** 2))(ours)
    g_theirs = eqx.filter_grad(
        lambda m: jnp.sum(
            jax.vmap(lambda x, v: m(x, x, x, mask=causal & v[None, :]))(x, valid) ** 2
        )
    )(theirs)
    _close(g_ours.q_proj.weight, g_theirs.query_proj.weight, rtol=1e-4, atol=1e-4)
    _close(g_ours.v_proj.weight, g_theirs.value_proj.weight, rtol=1e-4, atol=1e-4)


def test_grouped_query_attention_equals_full_attention_with_shared_key_value_heads():
    ours = tc.nn.MultiHeadAttention(16, 4, num_kv_heads=2, key=KEY)
    h = ours.head_dim

    # each key/value head serves two query heads: repeat its projection rows
    def repeat(w):
        return jnp.repeat(w.reshape(2, h, -1), 2, axis=0).reshape(4 * h, -1)

    theirs = eqx.nn.MultiheadAttention(4, 16, key=KEY)
    theirs = eqx.tree_at(
        lambda m: (
            m.query_proj.weight,
            m.key_proj.weight,
            m.value_proj.weight,
            m.output_proj.weight,
        ),
        theirs,
        (
            ours.q_proj.weight,
            repeat(ours.k_proj.weight),
            repeat(ours.v_proj.weight),
            ours.o_proj.weight,
        ),
    )
    x = _normal(1, (3, 7, 16))
    _close(ours(x), jax.vmap(lambda x: theirs(x, x, x))(x))


def test_rotary_attention_matches_equinox_rotary_embedding_on_the_heads():
    ours = tc.nn.MultiHeadAttention(16, 2, causal=True, rope_theta=10_000.0, key=KEY)
    theirs = eqx.nn.MultiheadAttention(2, 16, key=KEY)
    rope = eqx.nn.RotaryPositionalEmbedding(8, theta=10_000.0)

    def process_heads(q, k, v):
        turn = jax.vmap(rope, in_axes=1, out_axes=1)
        return turn(q), turn(k), v

    x = _normal(1, (6, 16))
    causal = jnp.tril(jnp.ones((6, 6), bool))
    _close(ours(x), theirs(x, x, x, mask=causal, process_heads=process_heads))


def test_cross_attention_matches_equinox():
    ours = tc.nn.MultiHeadAttention(16, 4, kv_features=8, key=KEY)
    theirs = eqx.nn.MultiheadAttention(4, 16, key_size=8, value_size=8, key=KEY)
    x, context = _normal(1, (5, 16)), _normal(2, (9, 8))
    _close(ours(x, context), theirs(x, context, context))


# -- MLP, Sequential, LoRA ------------------------------------------------------------------


def test_mlp_draws_equinox_weights_and_matches_its_output():
    ours = tc.nn.MLP(
        3, 2, hidden_features=8, depth=2, activation=jax.nn.gelu, final_activation=jnp.tanh, key=KEY
    )
    theirs = eqx.nn.MLP(3, 2, 8, 2, activation=jax.nn.gelu, final_activation=jnp.tanh, key=KEY)
    for a, b in zip(ours.layers, theirs.layers, strict=True):
        assert (a.weight == b.weight).all() and (a.bias == b.bias).all()
    x = _normal(1, (4, 3))
    _close(ours(x), jax.vmap(theirs)(x))


def test_sequential_matches_equinox_sequential():
    k1, k2 = jax.random.split(KEY)
    ours = tc.nn.Sequential(tc.nn.Linear(3, 5, key=k1), jax.nn.relu, tc.nn.Linear(5, 2, key=k2))
    theirs = eqx.nn.Sequential(
        [eqx.nn.Linear(3, 5, key=k1), eqx.nn.Lambda(jax.nn.relu), eqx.nn.Linear(5, 2, key=k2)]
    )
    x = _normal(1, (4, 3))
    _close(ours(x), jax.vmap(theirs)(x))


def test_lora_matches_nnx_lora_and_merges_into_one_linear():
    base = tc.nn.Linear(6, 4, key=KEY)
    ours = tc.nn.LoRA(base, rank=2, key=jax.random.key(1))
    ours = ours.at["lora_B"]["weight"].set(_normal(3, (4, 2)))
    theirs = nnx.LoRA(6, 2, 4, base_module=nnx.Linear(6, 4, rngs=nnx.Rngs(0)), rngs=nnx.Rngs(0))
    theirs.base_module.kernel[...], theirs.base_module.bias[...] = base.weight.T, base.bias
    theirs.lora_a[...], theirs.lora_b[...] = ours.lora_A.weight.T, ours.lora_B.weight.T
    x = _normal(2, (5, 6))
    _close(ours(x), theirs(x))  # alpha = rank: a scale of one, as nnx's
    _close(ours.merge()(x), ours(x))
    scaled = ours.replace(alpha=8.0)
    _close(scaled(x) - base(x), 4.0 * (ours(x) - base(x)))
    _close(scaled.merge()(x), scaled(x))
    assert type(ours.merge()) is tc.nn.Linear


def test_lora_gives_the_base_no_gradient_and_the_adapters_one():
    adapter = tc.nn.LoRA(tc.nn.Linear(6, 4, key=KEY), rank=2, key=jax.random.key(1))
    x = _normal(2, (5, 6))
    grads = jax.grad(lambda m: jnp.sum(m(x) ** 2))(adapter)
    assert not grads.base_layer.weight.any() and not grads.base_layer.bias.any()
    assert grads.lora_B.weight.any()
