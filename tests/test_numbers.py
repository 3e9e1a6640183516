"""One rule for a number put into an array: `.set` at a leaf and at a block of a stack."""

from __future__ import annotations

import math
import re
import warnings

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from conftest import device_holds
from hypothesis import given, settings
from hypothesis import strategies as st

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
    if np.isnan(np.asarray(3.11e-260).astype(dtype)):
        # an ml_dtypes that casts it to nan itself (as some releases do): the rule refuses it
        with pytest.raises(NumberRangeError, match=r"tree\['w'\].*no value near it"):
            tc.at(tree)["w"].set(3.11e-260)
        return
    out = tc.at(tree)["w"].set(3.11e-260)
    smallest = np.asarray(2.0**-127).astype(dtype)
    assert np.asarray(out["w"]).tobytes() == np.full((3,), smallest).tobytes()


# -- every scalar type, every dtype, every route ---------------------------------------------
# The number rule is one rule: a scalar of any NumPy or ml_dtypes number type (what indexing
# or reducing a bfloat16 / float8 checkpoint array gives), `np.longdouble`, or a Python
# number, put at an array leaf by any route, fills the leaf as a block write into a
# `tc.Stacked` does, or is refused by every route with the same error naming the leaf.


_NUMPY_SCALARS = [
    np.bool_,
    *(np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64),
    *(np.float16, np.float32, np.float64, np.longdouble, np.complex64, np.complex128),
    np.clongdouble,
]
_ML_SCALARS = [
    getattr(ml_dtypes, name)
    for name in (
        "bfloat16 float8_e4m3fn float8_e5m2 float8_e4m3b11fnuz float8_e4m3fnuz float8_e5m2fnuz "
        "float8_e3m4 float8_e4m3 float8_e8m0fnu float8_e5m3fnu float4_e2m1fn float6_e2m3fn "
        "float6_e3m2fn int1 uint1 int2 uint2 int4 uint4 complex32 bcomplex32"
    ).split()
    if hasattr(ml_dtypes, name)
]
SCALAR_TYPES = [bool, int, float, complex, *_NUMPY_SCALARS, *_ML_SCALARS]
# every dtype a JAX array holds here: not the float6 and e5m3fnu kinds (NumPy-only), nor int1
# and uint1, whose arrays JAX's own `where` mistakes for bool ones on this backend
_NOT_LEAVES = ("float6", "complex", "bcomplex", "float8_e5m3fnu", "int1", "uint1")
LEAF_DTYPES = [
    np.dtype(kind)
    for kind in (
        *(np.bool_, np.int8, np.int16, np.int32, np.uint8, np.uint16, np.uint32),
        *(np.float16, np.float32, np.complex64),
        *(t for t in _ML_SCALARS if not t.__name__.startswith(_NOT_LEAVES)),
    )
    if device_holds(kind)
]
RAW_VALUES = [0, 1, -1, 2, 2.5, -3.25, 7.0, 300, 1e5, 1e300, "inf", "nan", 0.1, 1 + 2j, 3 + 0j]


def _scalar(kind, raw):
    """A scalar of type `kind` made from `raw` (wrapped, rounded or saturated as its type
    does: whatever comes out is the input)."""
    raw = float(raw) if isinstance(raw, str) else raw
    if isinstance(raw, complex) and kind is not complex and "complex" not in kind.__name__:
        raw = raw.real
    if kind is bool:
        return bool(raw)
    if kind is int:
        return int(raw) if math.isfinite(raw) else 2**70
    if kind in (float, complex):
        return kind(raw)
    integral = np.dtype(kind).kind in "biu" or kind.__name__.startswith(("int", "uint"))
    if integral and not math.isfinite(abs(raw)):
        raw = 0  # no inf or nan in an integer type
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return np.asarray(raw).astype(kind)[()]


def _bits(x):
    x = np.asarray(x)
    return x.dtype, x.shape, x.tobytes()


def _same_value(a, b):
    """Equal bits, or both NaN (a NaN's payload may differ by the conversion's path)."""
    if _bits(a) == _bits(b):
        return True
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape or a.dtype.kind in "biu":
        return False
    wide = np.complex128 if "complex" in a.dtype.name else np.float64
    return bool(np.array_equal(a.astype(wide), b.astype(wide), equal_nan=True))


SHAPE = (2, 3)
PATH = "tree['w']"


def _routes(tree, value):
    """Every way of putting `value` at the array leaf `tree['w']` of shape SHAPE."""
    everywhere = jnp.ones(SHAPE, bool)
    return {
        "set": lambda: tc.at(tree)["w"].set(value)["w"],
        "apply": lambda: tc.at(tree)["w"].apply(lambda _: value)["w"],
        "scan": lambda: tc.at(tree)["w"].scan(lambda _, s: (value, s), 0)[0]["w"],
        "parallel": lambda: tc.at(tree)["w"].set(value, is_parallel=True)["w"],
        "mask": lambda: tc.at(tree)[{"w": everywhere}].set(value)["w"],
        "mask-apply": lambda: tc.at(tree)[{"w": everywhere}].apply(lambda _: value)["w"],
        # a mask one level down: the general walk, not the whole-tree fast path
        "mask-walk": lambda: tc.at({"a": tree})["a"][{"w": everywhere}].set(value)["a"]["w"],
        "mask-scan": lambda: tc.at(tree)[{"w": everywhere}].scan(lambda _, s: (value, s), 0)[0][
            "w"
        ],
    }


_WHOLE = {"set", "apply", "scan", "parallel"}  # routes where True / False are flags


def _outcome(fn):
    try:
        return fn(), None
    except (TypeError, ValueError) as error:  # NumberRangeError is a ValueError
        return None, error


# each scalar type is put once into a float and an int leaf by every route's block twin in
# the test below; this law samples the rest of the types x dtypes x values
@settings(max_examples=50, deadline=None)
@given(
    kind=st.sampled_from(SCALAR_TYPES),
    dtype=st.sampled_from(LEAF_DTYPES),
    raw=st.sampled_from(RAW_VALUES),
)
def test_every_route_puts_a_scalar_as_a_stacked_block_write_does(kind, dtype, raw):
    value = _scalar(kind, raw)
    stack = tc.Stacked({"w": jnp.zeros((3, *SHAPE), dtype)})
    want, refused = _outcome(lambda: stack.at[1]["w"].set(value)[1]["w"])
    if refused is not None:
        assert "['w']" in str(refused)
    tree = {"w": jnp.zeros(SHAPE, dtype)}
    before = _bits(tree["w"])
    for route, put in _routes(tree, value).items():
        if route in _WHOLE and type(value) in (bool, np.bool_):
            assert put() is value  # a flag at a whole leaf is put as it is (mask trees)
            continue
        got, error = _outcome(put)
        assert _bits(tree["w"]) == before, route
        if refused is not None:
            assert type(error) is type(refused), (route, error, refused)
            assert "['w']" in str(error), route  # the leaf's key path
            continue
        assert error is None, (route, error)
        assert got.shape == SHAPE and got.dtype == dtype, route
        assert _same_value(got, want), (route, got, want)


@pytest.mark.parametrize("kind", SCALAR_TYPES, ids=lambda t: t.__name__)
def test_every_scalar_type_is_a_number_to_set_and_to_a_stack(kind):
    # each type once, into a float32 leaf and an int8 leaf: a Python number is judged by its
    # value (2.0 fits int8), a NumPy / ml_dtypes one by its kind as well (a float type does not
    # fit int8, a complex type fits neither), on the whole-leaf route and the block route
    value = _scalar(kind, 2)
    name = kind.__name__
    for dtype in (np.dtype(np.float32), np.dtype(np.int8)):
        tree = {"w": jnp.zeros(SHAPE, dtype)}
        stack = tc.Stacked({"w": jnp.zeros((3, *SHAPE), dtype)})
        leaf, error = _outcome(lambda: tc.at(tree)["w"].set(value)["w"])  # noqa: B023
        block, block_error = _outcome(lambda: stack.at[1]["w"].set(value)[1]["w"])  # noqa: B023
        if kind in (bool, np.bool_):
            assert leaf is value and type(block_error) is TypeError  # a flag, not a number
            continue
        integral = name.startswith(("int", "uint"))
        complex_kind = np.dtype(kind).kind == "c" or "complex" in name
        fits = kind in (int, float, complex) or (
            not complex_kind and (dtype == np.float32 or integral)
        )
        assert type(error) is type(block_error)
        if fits:
            assert error is None
            assert leaf.shape == SHAPE and leaf.dtype == dtype
            assert np.asarray(leaf).tolist() == np.asarray(block).tolist()
            plain = complex(value.item() if isinstance(value, np.generic) else value).real
            assert np.asarray(leaf).tolist() == np.full(SHAPE, plain, dtype).tolist()
        else:
            assert type(error) is TypeError and PATH in str(error)
            assert f"{name}` is not of {dtype.name}'s kind" in str(error)


def test_a_bfloat16_scalar_fills_a_bfloat16_leaf_and_is_refused_by_an_int8_leaf():
    value = np.asarray([2.5, 1.0], ml_dtypes.bfloat16)[0]  # what indexing a checkpoint gives
    out = tc.at({"w": jnp.zeros(SHAPE, jnp.bfloat16)})["w"].set(value)["w"]
    assert out.shape == SHAPE and out.dtype == jnp.bfloat16
    assert np.asarray(out, np.float32).tolist() == np.full(SHAPE, 2.5).tolist()
    tree = {"w": jnp.zeros(SHAPE, jnp.int8)}
    with pytest.raises(TypeError, match=r"ml_dtypes\.bfloat16\(2\.5\).*tree\['w'\].*int8"):
        tc.at(tree)["w"].set(value)
    assert tree["w"].dtype == jnp.int8


def test_a_longdouble_fills_a_leaf_and_one_beyond_float64_is_refused_naming_the_leaf():
    out = tc.at({"w": jnp.zeros(SHAPE)})["w"].set(np.longdouble(0.25))["w"]
    assert out.dtype == jnp.float32 and np.asarray(out).tolist() == np.full(SHAPE, 0.25).tolist()
    huge = np.longdouble("1e400")
    for put in (
        lambda: tc.at({"w": jnp.zeros(SHAPE)})["w"].set(huge),
        lambda: tc.Stacked({"w": jnp.zeros((3, *SHAPE))}).at[1]["w"].set(huge),
    ):
        with pytest.raises(NumberRangeError, match=r"\['w'\].*float32 holds numbers up to"):
            put()
    # a NumPy leaf that holds it keeps it as it is
    wide = tc.at({"w": np.zeros(2, np.longdouble)})["w"].set(huge)["w"]
    assert wide.dtype == np.longdouble and (wide == huge).all()


def test_an_ml_dtypes_scalar_leaf_is_filled_in_its_own_type():
    out = tc.at({"w": ml_dtypes.bfloat16(1.0)})["w"].set(2.5)["w"]
    assert type(out) is ml_dtypes.bfloat16 and float(out) == 2.5
    with pytest.raises(TypeError, match=re.escape(PATH)):
        tc.at({"w": ml_dtypes.int4(1)})["w"].set(2.5)


def test_a_bool_into_elements_is_a_number_of_the_leaf_kind():
    # at a whole leaf True is a flag; into elements (a mask) it must fit the dtype
    mask = jnp.asarray([True, False])
    with pytest.raises(TypeError, match="a bool is a flag"):
        tc.at({"w": jnp.zeros(2)})[{"w": mask}].set(True)
    out = tc.at({"w": jnp.zeros(2, bool)})[{"w": mask}].set(np.True_)["w"]
    assert out.tolist() == [True, False]


def test_is_number_is_the_one_test_of_a_number():
    from treeclass._numbers import is_number

    assert all(is_number(_scalar(kind, 1)) for kind in SCALAR_TYPES)
    for other in ("1", b"1", None, np.str_("1"), np.timedelta64(1, "s"), jnp.ones(()), [1]):
        assert not is_number(other)


@pytest.mark.parametrize(
    "factor",
    [
        0.5,
        np.float32(0.5),
        np.longdouble(0.5),
        ml_dtypes.bfloat16(0.5),
        ml_dtypes.float8_e4m3fn(0.5),
    ],
    ids=repr,
)
def test_a_scalar_factor_of_scale_blocks_is_a_number_and_keeps_the_update_dtype(factor):
    optax = pytest.importorskip("optax")
    params = {"w": jnp.ones((2, 3), jnp.bfloat16)}
    opt = optax.chain(optax.sgd(1.0), tc.optim.scale_blocks({"w": factor}))
    updates, _ = opt.update(params, opt.init(params))
    assert updates["w"].dtype == jnp.bfloat16
    assert np.asarray(updates["w"], np.float32).tolist() == np.full((2, 3), -0.5).tolist()


@pytest.mark.parametrize(
    ("kind", "want"),
    [(np.longdouble, np.float32), (np.clongdouble, np.complex64), (ml_dtypes.bfloat16, None)],
    ids=lambda x: getattr(x, "__name__", str(x)),
)
def test_numbers_that_differ_between_blocks_stack_into_an_array_jax_holds(kind, want):
    stack = tc.Stacked.from_blocks([{"n": kind(k), "w": jnp.ones(2)} for k in (1, 2)])
    numbers = stack.tree["n"]
    assert numbers.dtype == np.dtype(want or kind) and numbers.tolist() == [1, 2]
    assert jnp.asarray(numbers).dtype == numbers.dtype  # no float128 error
