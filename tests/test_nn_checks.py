"""Every layer of `treeclass.nn` checks its arguments when it is built and its input's
feature size when it is called: each error names the argument, the value given and what
was expected, instead of a division by zero, a broadcast error or an XLA dump later."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import treeclass as tc

nn = tc.nn
KEY = jax.random.key(0)


def _base():
    return nn.Linear(3, 4, key=KEY)


# each layer built from its defaults with one argument replaced
BUILDERS = {
    "Linear": lambda **kw: nn.Linear(**{"in_features": 3, "out_features": 4, **kw}, key=KEY),
    "Embed": lambda **kw: nn.Embed(**{"num_embeddings": 5, "features": 3, **kw}, key=KEY),
    "LayerNorm": lambda **kw: nn.LayerNorm(**{"features": 3, **kw}),
    "RMSNorm": lambda **kw: nn.RMSNorm(**{"features": 3, **kw}),
    "BatchNorm": lambda **kw: nn.BatchNorm(**{"features": 3, **kw}),
    "Conv": lambda **kw: nn.Conv(
        **{"in_channels": 2, "out_channels": 4, "kernel_size": (3,), **kw}, key=KEY
    ),
    "Dropout": lambda **kw: nn.Dropout(**kw),
    "MultiHeadAttention": lambda **kw: nn.MultiHeadAttention(
        **{"features": 8, "num_heads": 2, **kw}, key=KEY
    ),
    "MLP": lambda **kw: nn.MLP(
        **{"in_features": 2, "out_features": 3, "hidden_features": 4, "depth": 1, **kw}, key=KEY
    ),
    "LoRA": lambda **kw: nn.LoRA(**{"base": _base(), "rank": 2, **kw}, key=KEY),
    "FeedForward": lambda **kw: nn.FeedForward(
        **{"features": 4, "hidden_features": 6, **kw}, key=KEY
    ),
    "PatchEmbed": lambda **kw: nn.PatchEmbed(
        **{"in_channels": 2, "features": 4, "patch_size": (2, 2), **kw}, key=KEY
    ),
    "ClassToken": lambda **kw: nn.ClassToken(**{"features": 4, **kw}, key=KEY),
    "PositionEmbedding": lambda **kw: nn.PositionEmbedding(
        **{"num_positions": 6, "features": 4, **kw}, key=KEY
    ),
    "DecoderBlock": lambda **kw: nn.DecoderBlock(
        **{"features": 8, "num_heads": 2, "hidden_features": 8, **kw}, key=KEY
    ),
    "EncoderBlock": lambda **kw: nn.EncoderBlock(
        **{"features": 8, "num_heads": 2, "hidden_features": 8, **kw}, key=KEY
    ),
}

SIZES = {  # (layer, argument): the smallest valid value
    ("Linear", "in_features"): 1,
    ("Linear", "out_features"): 1,
    ("Embed", "num_embeddings"): 1,
    ("Embed", "features"): 1,
    ("LayerNorm", "features"): 1,
    ("RMSNorm", "features"): 1,
    ("BatchNorm", "features"): 1,
    ("Conv", "in_channels"): 1,
    ("Conv", "out_channels"): 1,
    ("Conv", "stride"): 1,
    ("Conv", "dilation"): 1,
    ("Conv", "groups"): 1,
    ("MultiHeadAttention", "features"): 1,
    ("MultiHeadAttention", "num_heads"): 1,
    ("MultiHeadAttention", "num_kv_heads"): 1,
    ("MultiHeadAttention", "head_dim"): 1,
    ("MultiHeadAttention", "kv_features"): 1,
    ("MLP", "in_features"): 1,
    ("MLP", "out_features"): 1,
    ("MLP", "hidden_features"): 1,
    ("MLP", "depth"): 0,
    ("MultiHeadAttention", "sliding_window"): 1,
    ("LoRA", "rank"): 1,
    ("FeedForward", "features"): 1,
    ("FeedForward", "hidden_features"): 1,
    ("PatchEmbed", "in_channels"): 1,
    ("PatchEmbed", "features"): 1,
    ("ClassToken", "features"): 1,
    ("ClassToken", "num_tokens"): 1,
    ("PositionEmbedding", "num_positions"): 1,
    ("PositionEmbedding", "features"): 1,
    ("DecoderBlock", "features"): 1,
    ("DecoderBlock", "num_heads"): 1,
    ("DecoderBlock", "hidden_features"): 1,
    ("EncoderBlock", "features"): 1,
    ("EncoderBlock", "num_heads"): 1,
    ("EncoderBlock", "hidden_features"): 1,
}

NUMBERS = {  # (layer, argument): values out of its range
    ("LayerNorm", "eps"): [-1e-5, math.nan, math.inf],
    ("RMSNorm", "eps"): [-1.0, math.nan],
    ("BatchNorm", "eps"): [-1.0, math.inf],
    ("BatchNorm", "momentum"): [-0.1, 1.5, math.nan],
    ("Dropout", "rate"): [-0.1, 1.0, math.nan],
    ("MultiHeadAttention", "rope_theta"): [0.0, -10.0, math.inf],
    ("LoRA", "alpha"): [math.nan, math.inf],
    ("Embed", "scale"): [math.nan, -math.inf],
    ("RMSNorm", "weight_offset"): [math.nan],
    ("DecoderBlock", "norm_weight_offset"): [math.inf],
}

_TOO_SMALL = [
    pytest.param(layer, name, value, id=f"{layer}-{name}={value}")
    for (layer, name), low in SIZES.items()
    for value in (low - 1, low - 4)
]
_NOT_AN_INT = [
    pytest.param(layer, name, value, id=f"{layer}-{name}={value!r}")
    for (layer, name) in SIZES
    for value in (2.0, True, "3")
]
_OUT_OF_RANGE = [
    pytest.param(layer, name, value, id=f"{layer}-{name}={value}")
    for (layer, name), values in NUMBERS.items()
    for value in values
]
_NOT_A_NUMBER = [
    pytest.param(layer, name, value, id=f"{layer}-{name}={value!r}")
    for (layer, name) in NUMBERS
    for value in ("0.1", [0.1, 0.2], 1j)
]


def _names_it(error, layer, name, value):
    text = str(error.value)
    assert f"`{layer}({name}=...)`" in text, text
    assert repr(value) in text, text


def test_every_layer_is_in_the_table():
    assert set(BUILDERS) | {"Sequential", "Layer"} >= {
        n for n in nn.__all__ if isinstance(getattr(nn, n), type)
    }
    for build in BUILDERS.values():
        build()  # the defaults build


@pytest.mark.parametrize(("layer", "name", "value"), _TOO_SMALL)
def test_a_size_below_its_minimum_is_a_value_error_naming_argument_and_value(layer, name, value):
    with pytest.raises(ValueError) as error:
        BUILDERS[layer](**{name: value})
    _names_it(error, layer, name, value)


@pytest.mark.parametrize(("layer", "name", "value"), _NOT_AN_INT)
def test_a_size_that_is_not_an_int_is_a_type_error_naming_argument_and_value(layer, name, value):
    with pytest.raises(TypeError) as error:
        BUILDERS[layer](**{name: value})
    _names_it(error, layer, name, value)


@pytest.mark.parametrize(("layer", "name", "value"), _OUT_OF_RANGE)
def test_a_number_out_of_its_range_is_a_value_error_naming_argument_and_value(layer, name, value):
    with pytest.raises(ValueError) as error:
        BUILDERS[layer](**{name: value})
    _names_it(error, layer, name, value)


@pytest.mark.parametrize(("layer", "name", "value"), _NOT_A_NUMBER)
def test_a_number_argument_that_is_not_a_number_is_a_type_error(layer, name, value):
    with pytest.raises(TypeError) as error:
        BUILDERS[layer](**{name: value})
    _names_it(error, layer, name, value)


def test_integer_scalars_of_numpy_and_jax_are_sizes_and_stored_as_ints():
    layer = nn.Conv(np.int64(2), jnp.int32(4), (np.int8(3),), stride=np.int64(2), key=KEY)
    assert layer.weight.shape == (4, 2, 3) and layer.stride == (2,)
    assert type(layer.stride[0]) is int
    assert nn.MLP(2, 3, 4, depth=np.int64(0), key=KEY)(jnp.ones(2)).shape == (3,)


# -- per-axis and relational arguments ---------------------------------------------------------

CONV_CASES = [
    (dict(kernel_size=(0,)), ValueError, "kernel_size", "(0,)"),
    (dict(kernel_size=(3, -1)), ValueError, "kernel_size", "(3, -1)"),
    (dict(kernel_size=3), ValueError, "kernel_size", "3"),
    (dict(kernel_size=(1, 1, 1, 1)), ValueError, "kernel_size", "(1, 1, 1, 1)"),
    (dict(kernel_size=(3, 3), stride=(1, 0)), ValueError, "stride", "(1, 0)"),
    (dict(kernel_size=(3, 3), stride=(1, 1, 1)), TypeError, "stride", "(1, 1, 1)"),
    (dict(kernel_size=(3, 3), dilation=(2, -1)), ValueError, "dilation", "(2, -1)"),
    (dict(kernel_size=(3, 3), dilation=1.5), TypeError, "dilation", "1.5"),
    (dict(padding=-1), ValueError, "padding", "-1"),
    (dict(padding=((1, -2),)), ValueError, "padding", "((1, -2),)"),
    (dict(padding="FULL"), ValueError, "padding", "'FULL'"),
    (dict(padding=(1, 1)), ValueError, "padding", "(1, 1)"),
    (dict(groups=3), ValueError, "groups", "3"),
]


@pytest.mark.parametrize(("kwargs", "kind", "name", "given"), CONV_CASES, ids=str)
def test_conv_names_a_bad_kernel_stride_dilation_padding_or_groups(kwargs, kind, name, given):
    with pytest.raises(kind) as error:
        BUILDERS["Conv"](**kwargs)
    text = str(error.value)
    assert f"`Conv({name}=" in text and given in text, text


PATCH_CASES = [
    (dict(patch_size=(0, 2)), "(0, 2)"),
    (dict(patch_size=4), "4"),
    (dict(patch_size=(1, 1, 1, 1)), "(1, 1, 1, 1)"),
]


@pytest.mark.parametrize(("kwargs", "given"), PATCH_CASES, ids=str)
def test_patch_embed_names_a_bad_patch_size(kwargs, given):
    with pytest.raises(ValueError) as error:
        BUILDERS["PatchEmbed"](**kwargs)
    text = str(error.value)
    assert "`PatchEmbed(patch_size=" in text and given in text, text


ATTENTION_CASES = [
    (dict(num_kv_heads=3, num_heads=4), "num_kv_heads=3"),
    (dict(features=10, num_heads=4), "features=10"),
    (dict(head_dim=3, rope_theta=100.0), "rope_dim=3"),
    (dict(rope_theta=100.0, rope_dim=6), "rope_dim=6"),
]


@pytest.mark.parametrize(("kwargs", "given"), ATTENTION_CASES, ids=str)
def test_attention_names_heads_that_do_not_divide(kwargs, given):
    with pytest.raises(ValueError) as error:
        BUILDERS["MultiHeadAttention"](**kwargs)
    assert given in str(error.value)


def test_a_bad_argument_is_reported_before_a_missing_key():
    with pytest.raises(ValueError, match="in_features"):
        nn.Linear(-1, 2, key=None)


@settings(max_examples=20, deadline=None)
@given(n=st.integers(-(2**40), 4))
def test_a_linear_builds_exactly_when_both_sizes_are_positive(n):
    if n >= 1:
        assert nn.Linear(n, 2, key=KEY).in_features == n
        return
    with pytest.raises(ValueError, match=rf"in_features=\.\.\.\)` must be a positive int; got {n}"):
        nn.Linear(n, 2, key=KEY)


# -- the input's feature size, checked at the call ----------------------------------------------

CALLS = [
    ("Linear", lambda: BUILDERS["Linear"](), (2, 5), "in_features=3"),
    ("Linear", lambda: BUILDERS["Linear"](), (), "in_features=3"),
    ("Embed.attend", lambda: BUILDERS["Embed"]().attend, (2, 4), "features=3"),
    ("LayerNorm", lambda: BUILDERS["LayerNorm"](), (2, 4), "features=3"),
    ("LayerNorm", lambda: nn.LayerNorm(3, use_weight=False), (4,), "features=3"),
    ("RMSNorm", lambda: BUILDERS["RMSNorm"](), (2, 2), "features=3"),
    ("BatchNorm", lambda: nn.BatchNorm(3, training=False), (2, 4), "features=3"),
    ("BatchNorm", lambda: nn.BatchNorm(3, use_weight=False, use_bias=False), (2, 4), "features=3"),
    ("Conv", lambda: BUILDERS["Conv"](), (2, 5, 3), "in_channels=2"),
    ("Conv", lambda: BUILDERS["Conv"](groups=2), (5, 4), "in_channels=2"),
    ("Conv", lambda: nn.Conv(2, 4, (3, 3), key=KEY), (5, 2), "in_channels=2"),
    ("MultiHeadAttention", lambda: BUILDERS["MultiHeadAttention"](), (3, 4), "features=8"),
    ("MultiHeadAttention", lambda: BUILDERS["MultiHeadAttention"](), (8,), "features=8"),
    ("MLP", lambda: BUILDERS["MLP"](), (3, 3), "in_features=2"),
    ("LoRA", lambda: BUILDERS["LoRA"](), (4,), "in_features=3"),
    ("FeedForward", lambda: BUILDERS["FeedForward"](), (2, 3), "features=4"),
    (
        "PatchEmbed",
        lambda: BUILDERS["PatchEmbed"](channels_first=False),
        (4, 4, 3),
        "in_channels=2",
    ),
    ("PatchEmbed", lambda: BUILDERS["PatchEmbed"](), (3, 4, 4), "in_channels=2"),
    # fewer axes than the spatial ones and the channels: the right channel count, no image
    ("PatchEmbed", lambda: BUILDERS["PatchEmbed"](channels_first=False), (2,), "s1, in_channels"),
    ("PatchEmbed", lambda: BUILDERS["PatchEmbed"](channels_first=False), (4, 2), "in_channels=2"),
    ("PatchEmbed", lambda: BUILDERS["PatchEmbed"](), (2, 4), "in_channels=2, s0, s1"),
    ("ClassToken", lambda: BUILDERS["ClassToken"](), (2, 5), "features=4"),
    ("ClassToken", lambda: BUILDERS["ClassToken"](), (4,), "features=4"),
    ("PositionEmbedding", lambda: BUILDERS["PositionEmbedding"](), (2, 5), "features=4"),
    ("DecoderBlock", lambda: BUILDERS["DecoderBlock"](), (3, 4), "features=8"),
    ("EncoderBlock", lambda: BUILDERS["EncoderBlock"](), (8,), "features=8"),
]


@pytest.mark.parametrize(
    ("layer", "build", "shape", "expected"), CALLS, ids=lambda v: "build" if callable(v) else str(v)
)
def test_a_call_on_the_wrong_feature_size_names_the_argument_and_both_shapes(
    layer, build, shape, expected
):
    with pytest.raises(ValueError) as error:
        build()(jnp.ones(shape))
    text = str(error.value)
    assert f"`{layer}` takes" in text and expected in text, text
    assert f"got one of shape {shape}" in text, text


def test_cross_attention_names_the_context_size():
    attention = nn.MultiHeadAttention(8, 2, kv_features=6, key=KEY)
    with pytest.raises(ValueError, match=r"a context of shape \(\*batch, kv_seq, kv_features=6\)"):
        attention(jnp.ones((3, 8)), jnp.ones((4, 8)))


def test_the_feature_check_reads_the_weights_so_a_replaced_weight_is_followed():
    layer = BUILDERS["Linear"]().replace(weight=jnp.ones((4, 5)))
    assert layer(jnp.ones((2, 5))).shape == (2, 4)
    with pytest.raises(ValueError, match="in_features=5"):
        layer(jnp.ones((2, 3)))


def test_the_feature_check_holds_under_jit_and_inside_stacked_blocks():
    stack = tc.Stacked.from_init(lambda k: nn.Linear(3, 3, key=k), jax.random.split(KEY, 2))
    assert jax.jit(stack)(jnp.ones((2, 3))).shape == (2, 3)
    with pytest.raises(ValueError, match="in_features=3"):
        jax.jit(stack)(jnp.ones((2, 4)))
