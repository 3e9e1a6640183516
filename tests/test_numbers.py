"""One rule for a number put into an array: `.set` at a leaf and at a block of a stack."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import treeclass as tc
from treeclass._numbers import NumberRangeError, number_misfit


def _dtype(name):
    if not hasattr(jnp, name):
        pytest.skip(f"this JAX has no {name}")
    return np.dtype(getattr(jnp, name))


@pytest.mark.parametrize(
    ("dtype", "value", "error"),
    [
        ("int8", 300, NumberRangeError),
        ("int8", np.int64(300), NumberRangeError),
        ("uint8", -1, NumberRangeError),
        ("bool_", 2, NumberRangeError),
        ("float16", 1e6, NumberRangeError),
        ("float4_e2m1fn", float("inf"), NumberRangeError),
        ("float4_e2m1fn", float("nan"), NumberRangeError),
        ("float8_e8m0fnu", 0.0, NumberRangeError),
        ("float8_e4m3fn", 1000.0, NumberRangeError),
        ("int32", 2.5, TypeError),
        ("int32", float("nan"), TypeError),
        ("float32", 1j, TypeError),
        ("int8", np.float32(2.0), TypeError),
        ("float32", True, TypeError),
    ],
    ids=str,
)
def test_a_number_that_would_change_is_refused_at_a_leaf_and_at_a_block(dtype, value, error):
    dtype = _dtype(dtype)
    leaf_tree = {"w": jnp.zeros((2,), dtype)}
    stack_tree = {"blocks": tc.Stacked({"w": jnp.zeros((3, 2), dtype)})}
    edits = [
        (leaf_tree, lambda t: tc.at(t)["w"].set(value), "tree['w']"),
        (stack_tree, lambda t: tc.at(t)["blocks"][1]["w"].set(value), "tree['blocks'][1]['w']"),
    ]
    for tree, edit, where in edits:
        if error is TypeError and isinstance(value, bool) and tree is leaf_tree:
            continue  # True / False at a whole leaf is a flag (mask trees), put as it is
        before = [np.asarray(x).tobytes() for x in jax.tree_util.tree_leaves(tree)]
        with pytest.raises(error, match=re.escape(where)):
            edit(tree)
        assert [np.asarray(x).tobytes() for x in jax.tree_util.tree_leaves(tree)] == before


def test_a_range_error_is_both_an_overflow_error_and_a_value_error():
    with pytest.raises(OverflowError):
        tc.at({"w": jnp.zeros(2, jnp.int8)})["w"].set(300)
    with pytest.raises(ValueError):
        tc.at({"w": jnp.zeros(2, jnp.int8)})["w"].set(300)


@pytest.mark.parametrize(
    ("dtype", "value", "want"),
    [
        ("int8", 0.0, [0, 0]),
        ("int8", np.int64(-128), [-128, -128]),
        ("bool_", 1, [True, True]),
        ("float32", 0.1, [np.float32(0.1)] * 2),
        ("float32", 3 + 0j, [3.0, 3.0]),
        ("bfloat16", 2.5, [2.5, 2.5]),
        ("float16", float("inf"), [float("inf")] * 2),
        ("complex64", 1 + 2j, [1 + 2j, 1 + 2j]),
    ],
    ids=str,
)
def test_a_number_the_dtype_keeps_fills_the_leaf_and_the_block(dtype, value, want):
    dtype = _dtype(dtype)
    leaf = tc.at({"w": jnp.zeros((2,), dtype)})["w"].set(value)["w"]
    block = tc.Stacked({"w": jnp.zeros((3, 2), dtype)}).at[1]["w"].set(value)[1]["w"]
    for out in (leaf, block):
        assert out.dtype == dtype
        assert np.asarray(out).tolist() == np.asarray(want, dtype).tolist()


def test_number_misfit_names_the_reason():
    assert number_misfit(300, np.dtype(np.int8)) == (
        NumberRangeError,
        "int8 holds the integers -128 to 127",
    )
    assert number_misfit(0.5, np.dtype(np.float32)) is None
    error, reason = number_misfit(2.5, np.dtype(np.int32))
    assert error is TypeError and reason == "2.5 is not an integer"
    assert number_misfit(1, np.dtype(np.uint32)) is None
    error, reason = number_misfit(3, jax.random.key(0).dtype)
    assert error is TypeError and "holds no numbers" in reason


@pytest.mark.parametrize(
    "edit",
    [
        lambda t, v: tc.at(t)["w"].set(v),
        lambda t, v: tc.at(t)["w"].apply(lambda _: v),
        lambda t, v: tc.at(t)["w"].set(v, is_parallel=True),
        lambda t, v: tc.at(t)[{"w": t["w"] > 0}].set(v),  # an element mask
        lambda t, v: tc.at(t)[{"w": True}].set(v),  # a whole-leaf mask
        lambda t, v: tc.at(t)[jax.Array].set(v),  # a type selector
    ],
    ids=["set", "apply", "parallel", "element-mask", "leaf-mask", "type"],
)
def test_every_entry_point_applies_the_rule(edit):
    tree = {"w": jnp.arange(3, dtype=jnp.int8)}
    with pytest.raises(NumberRangeError, match=re.escape("tree['w']")):
        edit(tree, 300)
    with pytest.raises(TypeError, match=re.escape("tree['w']")):
        edit(tree, 2.5)
    out = edit(tree, 7.0)["w"]
    assert out.dtype == jnp.int8 and set(np.asarray(out).tolist()) <= {0, 7}
    assert tree["w"].tolist() == [0, 1, 2]


@pytest.mark.parametrize("backend", [np, jnp], ids=["numpy", "jax"])
def test_a_tiny_number_into_float8_e8m0fnu_becomes_its_smallest_value_not_nan(backend):
    # the number rule keeps it (e8m0 rounds it up to 2**-127); a fill through float32
    # would have made it nan
    import ml_dtypes

    dtype = np.dtype(ml_dtypes.float8_e8m0fnu)
    tree = {"w": backend.ones((3,), dtype)}
    out = tc.at(tree)["w"].set(3.11e-260)
    smallest = np.asarray(2.0**-127).astype(dtype)
    assert np.asarray(out["w"]).tobytes() == np.full((3,), smallest).tobytes()
