"""The options model families need, and the blocks that make a family a configuration,
each against a peer's numerics (equinox) or a float64 NumPy reference written here from
the published definitions: partial and interleaved rotary embeddings, sliding windows,
per-projection biases, RMSNorm's `(offset + w)`, scaled embeddings, channels-first
patches, class tokens, learned positions, the gated feed-forward; then decoder and
encoder blocks configured as Llama, Qwen2, Mistral, Gemma, GPT-NeoX, BERT and ViT."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import reference_tol
from hypothesis import given, settings
from hypothesis import strategies as st

import treeclass as tc

eqx = pytest.importorskip("equinox")

nn = tc.nn
KEY = jax.random.key(0)
TOL = reference_tol()
pytestmark = pytest.mark.usefixtures("highest_precision")


def _normal(seed, shape):
    return jax.random.normal(jax.random.key(seed), shape)


def _f64(a):
    return np.asarray(a, np.float64)


# -- float64 references ------------------------------------------------------------------------


def np_rope(x, positions, theta, dim=None, interleaved=False):
    """Each pair of the first `dim` dimensions of every head turned by its angle, pair by
    pair as the definitions write it: (a, b) -> (a cos - b sin, b cos + a sin)."""
    x = _f64(x)
    dim = x.shape[-1] if dim is None else dim
    out = x.copy()
    for i in range(dim // 2):
        a, b = (2 * i, 2 * i + 1) if interleaved else (i, i + dim // 2)
        angle = _f64(positions)[..., None] * theta ** (-2.0 * i / dim)  # over the heads
        cos, sin = np.cos(angle), np.sin(angle)
        out[..., a] = x[..., a] * cos - x[..., b] * sin
        out[..., b] = x[..., b] * cos + x[..., a] * sin
    return out


def np_linear(layer, x):
    y = _f64(x) @ _f64(layer.weight).T
    return y if layer.bias is None else y + _f64(layer.bias)


def np_attention(attn, x, mask=None):
    """Attention by the textbook, in float64: `attn`'s weights and options."""
    x = _f64(x)
    *batch, seq, _ = x.shape
    h, kv, d = attn.num_heads, attn.num_kv_heads, attn.head_dim
    q = np_linear(attn.q_proj, x).reshape(*batch, seq, h, d)
    k = np_linear(attn.k_proj, x).reshape(*batch, seq, kv, d)
    v = np_linear(attn.v_proj, x).reshape(*batch, seq, kv, d)
    if attn.rope_theta is not None:
        pos = np.arange(seq)
        rope = (attn.rope_theta, attn.rope_dim, attn.rope_interleaved)
        q, k = np_rope(q, pos, *rope), np_rope(k, pos, *rope)
    k, v = np.repeat(k, h // kv, axis=-2), np.repeat(v, h // kv, axis=-2)
    scores = np.einsum("...thd,...shd->...hts", q, k) / np.sqrt(d)
    i, j = np.arange(seq)[:, None], np.arange(seq)[None, :]
    allowed = np.ones((seq, seq), bool)
    if attn.causal:
        allowed &= j <= i
    if attn.sliding_window is not None:
        allowed &= (i - j < attn.sliding_window) & (j - i < attn.sliding_window)
    if mask is not None:
        allowed = allowed & np.asarray(mask)
    scores = np.where(allowed, scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    out = np.einsum("...hts,...shd->...thd", weights, v).reshape(*batch, seq, h * d)
    return np_linear(attn.o_proj, out)


def np_rms_norm(norm, x):
    x = _f64(x)
    y = x / np.sqrt((x**2).mean(-1, keepdims=True) + norm.eps)
    return y * (norm.weight_offset + _f64(norm.weight))


def np_layer_norm(norm, x):
    x = _f64(x)
    mean = x.mean(-1, keepdims=True)
    y = (x - mean) / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + norm.eps)
    return y * _f64(norm.weight) + _f64(norm.bias)


def _close(ours, reference, **tol):
    np.testing.assert_allclose(np.asarray(ours, np.float64), reference, **(tol or TOL))


# -- rotary: partial and interleaved -----------------------------------------------------------


@pytest.mark.parametrize("rope_dim", [None, 4, 2])
@pytest.mark.parametrize("interleaved", [False, True])
def test_rotary_embedding_matches_the_pairwise_definition(rope_dim, interleaved):
    x = _normal(1, (2, 5, 3, 8))
    positions = jnp.arange(5) + 3
    ours = nn.rotary_embedding(x, positions, 100.0, rope_dim=rope_dim, interleaved=interleaved)
    _close(ours, np_rope(x, positions, 100.0, rope_dim, interleaved))
    if rope_dim is not None:  # the dimensions past rope_dim pass through untouched
        assert (ours[..., rope_dim:] == x[..., rope_dim:]).all()


def test_half_split_rotary_is_equinox_s():
    x = _normal(1, (6, 8))
    theirs = eqx.nn.RotaryPositionalEmbedding(8, theta=10_000.0)(x)
    _close(nn.rotary_embedding(x[:, None, :], jnp.arange(6), 10_000.0)[:, 0], _f64(theirs))


@settings(max_examples=6, deadline=None)
@given(pairs=st.integers(1, 3), extra=st.integers(0, 2), seq=st.integers(1, 3))
def test_interleaved_rotary_is_half_split_rotary_on_dimensions_reordered(pairs, extra, seq):
    # (2i, 2i + 1) are the pairs of the interleaved layout; put evens first, odds second,
    # and they become the half-split layout's (i, i + dim / 2)
    dim = 2 * pairs
    x = _normal(seq, (seq, 2, dim + extra))
    order = np.r_[np.arange(0, dim, 2), np.arange(1, dim, 2), np.arange(dim, dim + extra)]
    back = np.argsort(order)
    positions = jnp.arange(seq) * 2.0

    @jax.jit  # every example has new shapes: one program each, not one per operation
    def both(x, positions):
        interleaved = nn.rotary_embedding(x, positions, 50.0, rope_dim=dim, interleaved=True)
        half = nn.rotary_embedding(x[..., order], positions, 50.0, rope_dim=dim)[..., back]
        return interleaved, half

    interleaved, half = both(x, positions)
    np.testing.assert_allclose(interleaved, half, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "options",
    [
        dict(rope_dim=4),  # GPT-NeoX: rotary_pct=0.5 of head_dim 8
        dict(rope_dim=4, rope_interleaved=True),  # GPT-J: rotary_dim=4
        dict(rope_interleaved=True),
    ],
    ids=str,
)
def test_attention_with_partial_or_interleaved_rotary_matches_the_reference(options):
    attn = nn.MultiHeadAttention(16, 2, causal=True, rope_theta=10_000.0, key=KEY, **options)
    x = _normal(1, (2, 5, 16))
    _close(attn(x), np_attention(attn, x))


def test_rotary_options_without_rope_theta_or_with_a_bad_rope_dim_are_refused():
    with pytest.raises(ValueError, match="rope_dim=...\\)` configures rotary"):
        nn.MultiHeadAttention(16, 2, rope_dim=4, key=KEY)
    with pytest.raises(ValueError, match="rope_interleaved"):
        nn.MultiHeadAttention(16, 2, rope_interleaved=True, key=KEY)
    for bad in (3, 10):
        with pytest.raises(ValueError, match=f"rope_dim={bad}"):
            nn.MultiHeadAttention(16, 2, rope_theta=1e4, rope_dim=bad, key=KEY)
    full = nn.MultiHeadAttention(16, 2, rope_theta=1e4, rope_dim=8, key=KEY)
    assert full.rope_dim is None  # all of head_dim is the default, stored as such


# -- sliding windows ---------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [True, False])
def test_sliding_window_attention_matches_equinox_with_the_window_as_a_mask(causal):
    ours = nn.MultiHeadAttention(16, 4, causal=causal, sliding_window=3, key=KEY)
    theirs = eqx.nn.MultiheadAttention(4, 16, key=KEY)
    i, j = jnp.arange(7)[:, None], jnp.arange(7)[None, :]
    window = (i - j < 3) & ((j <= i) if causal else (j - i < 3))
    x = _normal(1, (2, 7, 16))
    _close(ours(x), _f64(jax.vmap(lambda x: theirs(x, x, x, mask=window))(x)))
    _close(ours(x), np_attention(ours, x))


def test_sliding_window_composes_with_a_padding_mask_and_grouped_heads():
    attn = nn.MultiHeadAttention(16, 4, num_kv_heads=2, causal=True, sliding_window=3, key=KEY)
    x = _normal(1, (2, 6, 16))
    valid = jnp.arange(6) < jnp.array([[6], [4]])
    mask = valid[:, None, None, :]
    _close(attn(x, mask=mask), np_attention(attn, x, mask=np.asarray(mask)))


def test_a_window_as_long_as_the_sequence_changes_nothing():
    attn = nn.MultiHeadAttention(8, 2, causal=True, key=KEY)
    x = _normal(1, (5, 8))
    np.testing.assert_allclose(attn.replace(sliding_window=5)(x), attn(x), **TOL)
    assert not np.allclose(attn.replace(sliding_window=2)(x), attn(x))


# -- per-projection biases ---------------------------------------------------------------------


def test_qwen2_biases_on_qkv_only_match_equinox():
    ours = nn.MultiHeadAttention(16, 4, use_qkv_bias=True, key=KEY)
    theirs = eqx.nn.MultiheadAttention(
        4, 16, use_query_bias=True, use_key_bias=True, use_value_bias=True, key=KEY
    )
    assert ours.o_proj.bias is None and ours.q_proj.bias is not None
    for a, b in [("q_proj", "query_proj"), ("k_proj", "key_proj"), ("v_proj", "value_proj")]:
        assert (getattr(ours, a).bias == getattr(theirs, b).bias).all()
    x = _normal(1, (2, 5, 16))
    _close(ours(x), _f64(jax.vmap(lambda x: theirs(x, x, x))(x)))


def test_each_bias_option_falls_back_to_use_bias():
    def biased(attn):
        return [getattr(attn, p).bias is not None for p in ("q_proj", "v_proj", "o_proj")]

    assert biased(nn.MultiHeadAttention(8, 2, use_bias=True, key=KEY)) == [True] * 3
    assert biased(nn.MultiHeadAttention(8, 2, use_out_bias=True, key=KEY)) == [False, False, True]
    both = nn.MultiHeadAttention(8, 2, use_bias=True, use_out_bias=False, key=KEY)
    assert biased(both) == [True, True, False]


# -- RMSNorm (offset + w), scaled embeddings ---------------------------------------------------


def test_rms_norm_with_an_offset_starts_at_one_and_matches_the_reference():
    norm = nn.RMSNorm(6, weight_offset=1.0, eps=1e-6)
    assert (norm.weight == 0).all()  # the scale 1 + w starts at one
    x = _normal(1, (3, 6)) * 2
    np.testing.assert_allclose(norm(x), nn.RMSNorm(6, eps=1e-6)(x), **TOL)
    trained = norm.replace(weight=_normal(2, (6,)) * 0.1)
    _close(trained(x), np_rms_norm(trained, x))


def test_rms_norm_offset_scales_in_float32_before_the_cast_as_gemma_does():
    norm = nn.RMSNorm(64, weight_offset=1.0, param_dtype=jnp.bfloat16)
    norm = norm.replace(weight=(_normal(2, (64,)) * 0.1).astype(jnp.bfloat16))
    x = (_normal(1, (4, 64)) * 3).astype(jnp.bfloat16)
    # Gemma: output = norm(x.float()) * (1 + w.float()), then .type_as(x)
    xs = x.astype(jnp.float32)
    normed = xs * jax.lax.rsqrt(jnp.mean(xs**2, -1, keepdims=True) + 1e-5)
    gemma = (normed * (1.0 + norm.weight.astype(jnp.float32))).astype(jnp.bfloat16)
    got = norm(x)
    assert got.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(gemma, np.float32))


def test_embed_scale_multiplies_the_vectors_by_the_factor_rounded_to_their_dtype():
    table = nn.Embed(10, 64, scale=64**0.5, key=KEY)
    ids = jnp.array([[1, 4], [9, 0]])
    np.testing.assert_array_equal(table(ids), table.weight[ids] * 8.0)
    bf16 = nn.Embed(10, 6, scale=6**0.5, param_dtype=jnp.bfloat16, key=KEY)
    # Gemma: hidden * torch.tensor(width ** 0.5, dtype=hidden.dtype)
    expected = bf16.weight[ids] * jnp.asarray(6**0.5, jnp.bfloat16)
    assert bf16(ids).dtype == jnp.bfloat16
    np.testing.assert_array_equal(
        np.asarray(bf16(ids), np.float32), np.asarray(expected, np.float32)
    )
    np.testing.assert_array_equal(
        table.attend(_normal(1, (64,))), table.replace(scale=None).attend(_normal(1, (64,)))
    )


# -- patches, class tokens, positions ----------------------------------------------------------


def test_patch_embed_is_equinox_s_channels_first_convolution_flattened_to_a_sequence():
    ours = nn.PatchEmbed(3, 8, (4, 4), key=KEY)
    theirs = eqx.nn.Conv2d(3, 8, (4, 4), stride=(4, 4), key=KEY)
    assert (ours.weight == theirs.weight).all()  # equinox's draw, ViT's layout
    images = _normal(1, (2, 3, 8, 12))
    expected = jax.vmap(theirs)(images)  # (2, 8, 2, 3)
    expected = expected.reshape(2, 8, -1).transpose(0, 2, 1)  # ViT: flatten(2).transpose(1, 2)
    _close(ours(images), _f64(expected))
    last = ours.replace(channels_first=False)
    _close(last(jnp.moveaxis(images, 1, -1)), _f64(expected))


def test_patch_embed_takes_unbatched_and_several_batch_axes_and_refuses_partial_patches():
    patches = nn.PatchEmbed(2, 4, (2, 2), key=KEY)
    x = _normal(1, (3, 2, 2, 4, 6))
    np.testing.assert_allclose(patches(x)[1, 0], patches(x[1, 0]), **TOL)
    assert patches(x).shape == (3, 2, 6, 4)
    with pytest.raises(ValueError, match=r"5 \(axis 1\) is not a multiple of 2"):
        patches(jnp.ones((2, 5, 4)))
    with pytest.raises(ValueError, match="in_channels=2"):
        patches(jnp.ones((3, 4, 4)))


def test_class_token_goes_in_front_of_every_sequence():
    cls = nn.ClassToken(4, num_tokens=2, key=KEY)
    x = _normal(1, (3, 5, 4))
    y = cls(x)
    assert y.shape == (3, 7, 4)
    np.testing.assert_array_equal(y[:, :2], jnp.broadcast_to(cls.weight, (3, 2, 4)))
    np.testing.assert_array_equal(y[:, 2:], x)
    assert cls(x[0]).shape == (7, 4)


def test_position_embedding_adds_the_rows_of_the_positions_and_refuses_a_longer_sequence():
    positions = nn.PositionEmbedding(6, 4, key=KEY)
    x = _normal(1, (2, 5, 4))
    _close(positions(x), _f64(x) + _f64(positions.weight[:5]))
    shifted = positions(x[:, :2], positions=jnp.array([[4, 5], [0, 3]]))
    _close(shifted, _f64(x[:, :2]) + _f64(positions.weight[jnp.array([[4, 5], [0, 3]])]))
    with pytest.raises(
        ValueError, match=r"num_positions=6\)` holds 6 positions; got a sequence of 7"
    ):
        positions(jnp.ones((7, 4)))


# -- the feed-forward --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gated", "activation", "reference"),
    [
        (True, jax.nn.silu, lambda h: h / (1 + np.exp(-h))),
        (True, jax.nn.gelu, None),  # GeGLU, Gemma's tanh GELU
        (False, None, None),  # BERT's exact GELU
    ],
)
def test_feed_forward_matches_the_reference(gated, activation, reference):
    from math import erf

    exact_gelu = np.vectorize(lambda h: 0.5 * h * (1 + erf(h / np.sqrt(2))))

    def tanh_gelu(h):
        return 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h**3)))

    act = reference or (tanh_gelu if activation is jax.nn.gelu else exact_gelu)
    ff = nn.FeedForward(6, 10, gated=gated, activation=activation, key=KEY)
    x = _normal(1, (3, 6))
    hidden = act(np_linear(ff.gate_proj if gated else ff.up_proj, x))
    if gated:
        hidden = hidden * np_linear(ff.up_proj, x)
    _close(ff(x), np_linear(ff.down_proj, hidden))


# -- blocks: each family a configuration -------------------------------------------------------


def _exact_gelu(h):
    from math import erf

    return np.vectorize(lambda v: 0.5 * v * (1 + erf(v / np.sqrt(2))))(h)


def _tanh_gelu(h):
    return 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h**3)))


NP_ACTIVATIONS = {
    jax.nn.silu: lambda h: h / (1 + np.exp(-h)),
    jax.nn.gelu: _tanh_gelu,
    nn.gelu_exact: _exact_gelu,
}


def np_feed_forward(ff, x):
    act = NP_ACTIVATIONS[ff.activation]
    if ff.gate_proj is None:
        return np_linear(ff.down_proj, act(np_linear(ff.up_proj, x)))
    return np_linear(ff.down_proj, act(np_linear(ff.gate_proj, x)) * np_linear(ff.up_proj, x))


def np_norm(norm, x):
    return np_rms_norm(norm, x) if isinstance(norm, nn.RMSNorm) else np_layer_norm(norm, x)


def np_block(block, x, mask=None):
    """A transformer layer as each family's modelling code writes it, in float64."""
    x = _f64(x)

    def attend(h):
        return np_attention(block.self_attn, h, mask)

    def mlp(h):
        return np_feed_forward(block.mlp, h)

    if block.norm_position == "post":  # BERT
        x = np_norm(block.post_attention_layernorm, x + attend(x))
        return np_norm(block.output_layernorm, x + mlp(x))
    if block.parallel_residual:  # GPT-NeoX
        return (
            x
            + attend(np_norm(block.input_layernorm, x))
            + mlp(np_norm(block.post_attention_layernorm, x))
        )
    x = x + attend(np_norm(block.input_layernorm, x))
    return x + mlp(np_norm(block.post_attention_layernorm, x))


# features 16, 4 heads, hidden 24: each family's keywords
FAMILIES = {
    "llama": lambda key: nn.DecoderBlock(16, 4, 24, num_kv_heads=2, rope_theta=1e4, key=key),
    "qwen2": lambda key: nn.DecoderBlock(
        16, 4, 24, num_kv_heads=2, rope_theta=1e6, norm_eps=1e-6, use_qkv_bias=True, key=key
    ),
    "mistral": lambda key: nn.DecoderBlock(
        16, 4, 24, num_kv_heads=2, rope_theta=1e6, sliding_window=3, key=key
    ),
    "gemma": lambda key: nn.DecoderBlock(
        16,
        4,
        24,
        num_kv_heads=1,
        head_dim=6,
        rope_theta=1e4,
        norm_eps=1e-6,
        norm_weight_offset=1.0,
        activation=jax.nn.gelu,
        key=key,
    ),
    "gpt-neox": lambda key: nn.DecoderBlock(
        16,
        4,
        24,
        rope_theta=1e4,
        rope_dim=2,
        norm="layer",
        gated=False,
        use_qkv_bias=True,
        use_out_bias=True,
        use_mlp_bias=True,
        parallel_residual=True,
        key=key,
    ),
    "gpt-j": lambda key: nn.DecoderBlock(
        16,
        4,
        24,
        rope_theta=1e4,
        rope_dim=2,
        rope_interleaved=True,
        norm="layer",
        gated=False,
        activation=jax.nn.gelu,
        use_mlp_bias=True,
        parallel_residual=True,
        key=key,
    ),
    "bert": lambda key: nn.EncoderBlock(16, 4, 24, key=key),
    "vit": lambda key: nn.EncoderBlock(16, 4, 24, norm_position="pre", key=key),
}


def _perturbed(tree, seed=7):
    # norms start at one and zero, biases small: move every array so that each counts
    leaves, treedef = jax.tree.flatten(tree)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return treedef.unflatten(
        [leaf + 0.2 * jax.random.normal(k, leaf.shape) for k, leaf in zip(keys, leaves)]
    )


@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_family_s_block_matches_its_float64_reference(family):
    block = _perturbed(FAMILIES[family](KEY))
    x = _normal(1, (2, 5, 16))
    valid = jnp.arange(5) < jnp.array([[5], [4]])
    mask = valid[:, None, None, :]
    _close(block(x, mask=mask), np_block(block, x, np.asarray(mask)), rtol=1e-4, atol=1e-4)


def test_a_llama_block_s_parameters_are_named_as_the_checkpoint_names_them():
    block = FAMILIES["llama"](KEY)
    names = {
        jax.tree_util.keystr(path, simple=True, separator="."): leaf.shape
        for path, leaf in jax.tree_util.tree_leaves_with_path(block)
    }
    assert names == {  # model.layers.{i}.* in a Llama checkpoint
        "input_layernorm.weight": (16,),
        "self_attn.q_proj.weight": (16, 16),
        "self_attn.k_proj.weight": (8, 16),
        "self_attn.v_proj.weight": (8, 16),
        "self_attn.o_proj.weight": (16, 16),
        "post_attention_layernorm.weight": (16,),
        "mlp.gate_proj.weight": (24, 16),
        "mlp.up_proj.weight": (24, 16),
        "mlp.down_proj.weight": (16, 24),
    }


def test_stacked_decoder_blocks_equal_the_blocks_applied_in_turn():
    keys = jax.random.split(KEY, 2)
    stack = tc.Stacked.from_init(FAMILIES["mistral"], keys)
    x = _normal(1, (2, 4, 16))
    mask = (jnp.arange(4) < jnp.array([[4], [3]]))[:, None, None, :]

    @jax.jit  # the blocks made and applied in one program, not operation by operation
    def in_turn(keys, x, mask):
        for i in range(len(keys)):
            x = FAMILIES["mistral"](keys[i])(x, mask=mask)
        return x

    np.testing.assert_allclose(stack(x, mask=mask), in_turn(keys, x, mask), **TOL)


BLOCK_ERRORS = [
    (dict(norm="batch"), "norm=...)` must be 'rms'"),
    (dict(norm_position="middle"), "norm_position=...)` must be 'pre'"),
    (dict(norm_position="post", parallel_residual=True), "needs norm_position='pre'"),
    (dict(norm="layer", norm_weight_offset=1.0), "option of RMSNorm"),
    (dict(hidden_features=0), "`DecoderBlock(hidden_features=...)` must be a positive int"),
    (dict(features=-2), "`DecoderBlock(features=...)` must be a positive int; got -2"),
    (dict(activation="relu"), "activation=...)` must be a function"),
]


@pytest.mark.parametrize(("options", "message"), BLOCK_ERRORS, ids=str)
def test_a_block_names_a_bad_configuration(options, message):
    arguments = {"features": 8, "num_heads": 2, "hidden_features": 8, **options}
    with pytest.raises((TypeError, ValueError)) as error:
        nn.DecoderBlock(**arguments, key=KEY)
    assert message in str(error.value)


def test_a_block_names_a_wrong_input_size():
    with pytest.raises(
        ValueError, match=r"`EncoderBlock` takes inputs of shape \(\*batch, seq, features=16\)"
    ):
        FAMILIES["bert"](KEY)(jnp.ones((3, 8)))
