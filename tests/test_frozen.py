"""The frozen wrapper: what a frozen value answers, and when freezing is the wrong tool."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import treeclass as tc


@pytest.mark.parametrize(
    "value",
    [jnp.ones((2, 3)), np.zeros((4,), np.int8), jnp.ones((), jnp.bfloat16), np.float32(1.5)],
)
def test_frozen_array_answers_shape_dtype_ndim_and_size(value):
    frozen = tc.freeze(value)
    inner = np.asarray(value)
    assert frozen.shape == inner.shape and frozen.dtype == value.dtype
    assert frozen.ndim == inner.ndim and frozen.size == inner.size


def test_frozen_value_without_a_shape_says_to_unfreeze():
    with pytest.raises(AttributeError, match=r"(?s)no attribute 'shape'.*tc\.unfreeze\(x\)"):
        _ = tc.freeze("relu").shape


def test_frozen_array_still_refuses_computation():
    frozen = tc.freeze(jnp.ones(2))
    with pytest.raises(TypeError, match="Unfreeze it first"):
        _ = frozen + 1
    with pytest.raises(AttributeError, match="Unfreeze it first"):
        _ = frozen.T


def test_freezing_more_than_a_mebibyte_of_arrays_warns_naming_the_frozen_field():
    with pytest.warns(tc.FrozenArrayWarning, match=r'(?s)2\.00MiB.*tc\.field\(role="frozen"\)'):
        tc.freeze(jnp.zeros((512, 1024)))
    with pytest.warns(tc.FrozenArrayWarning):  # a subtree counts all its arrays
        tc.freeze({"a": np.zeros((256, 1024), np.float32), "b": np.zeros(8, np.float32)})


@pytest.mark.parametrize(
    "value",
    [
        jax.nn.relu,
        "gelu",
        True,
        3,
        1e-5,
        jnp.zeros((256, 1024)),  # exactly 1 MiB: not more
        np.arange(1000),
        {"table": jnp.ones((64, 64)), "name": "emb"},
        (jnp.ones(3), jnp.int32(2)),
    ],
)
def test_freezing_functions_flags_and_small_arrays_does_not_warn(value):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        frozen = tc.freeze(value)
    assert tc.is_frozen(frozen)


def test_freezing_a_frozen_value_again_does_not_warn_again():
    with pytest.warns(tc.FrozenArrayWarning):
        frozen = tc.freeze(jnp.zeros((600, 1024)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tc.freeze(frozen) is frozen
