"""Value facts: one exact key for every value, and every use of it agrees."""

from __future__ import annotations

import math
import operator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import treeclass as tc
from treeclass import _values

pytestmark = pytest.mark.usefixtures("strict_jax")


class Static(tc.TreeClass):
    value: Any = tc.field(static=True)


_scalars = st.one_of(
    st.integers(-3, 3),
    st.booleans(),
    st.sampled_from([0.0, -0.0, 1.0, 1.5, math.inf, -math.inf, math.nan]),
    st.sampled_from(["", "a", "relu"]),
    st.none(),
    st.sampled_from([np.float32(0.0), np.float32(-0.0), np.int32(1), np.float64(1.0)]),
    st.sampled_from([complex(0.0, -0.0), complex(0.0, 0.0), 1j]),
)
_values_strategy = st.recursive(_scalars, lambda kids: st.tuples(kids, kids), max_leaves=4)


@given(_values_strategy, _values_strategy)
def test_static_fields_frozen_values_and_partials_agree_on_equality(a, b):
    same = _values.exact_key(a) == _values.exact_key(b)
    assert (tc.freeze(a) == tc.freeze(b)) == same
    assert (tc.Partial(operator.add, a) == tc.Partial(operator.add, b)) == same
    static_a = jax.tree_util.tree_structure(Static(a))
    static_b = jax.tree_util.tree_structure(Static(b))
    assert (static_a == static_b) == same
    if same:
        assert hash(tc.freeze(a)) == hash(tc.freeze(b))
        assert hash(tc.Partial(operator.add, a)) == hash(tc.Partial(operator.add, b))


_arrays = st.sampled_from(
    [
        lambda: jnp.zeros(2),
        lambda: jnp.array([-0.0, 0.0]),
        lambda: jnp.array([jnp.nan, 1.0]),
        lambda: jnp.zeros(2, jnp.int32),
        lambda: jnp.zeros((2, 1)),
        lambda: jnp.asarray(1.0),  # weakly typed
        lambda: jnp.asarray(1.0, jnp.float32),
        lambda: np.zeros(2),
        lambda: np.zeros(2, np.float32),
    ]
)
_containers = st.recursive(
    _scalars | _arrays.map(lambda make: make()),
    lambda kids: (
        st.lists(kids, max_size=2)
        | st.dictionaries(st.sampled_from(["a", "b"]), kids, max_size=2)
        | st.tuples(kids, kids)
    ),
    max_leaves=4,
)


@given(_containers, _containers)
def test_frozen_values_and_partials_agree_on_arrays_and_containers(a, b):
    # static fields cannot hold these (unhashable, or arrays: warned and keyed by identity)
    same = _values.exact_key(a) == _values.exact_key(b)
    assert (tc.freeze(a) == tc.freeze(b)) == same
    assert (tc.Partial(operator.add, a) == tc.Partial(operator.add, b)) == same
    assert (tc.Partial(operator.add, x=a) == tc.Partial(operator.add, x=b)) == same
    if same:
        assert hash(tc.freeze(a)) == hash(tc.freeze(b))
        assert hash(tc.Partial(operator.add, a)) == hash(tc.Partial(operator.add, b))


@given(_arrays, _arrays)
def test_fresh_equal_arrays_are_one_static_value_and_distinct_ones_are_not(make_a, make_b):
    a, b = make_a(), make_b()
    same = _values.exact_key(a) == _values.exact_key(b)
    expected = (
        type(a) is type(b)
        and a.shape == b.shape
        and a.dtype == b.dtype
        and getattr(a, "weak_type", False) == getattr(b, "weak_type", False)
        and np.asarray(a).tobytes() == np.asarray(b).tobytes()
    )
    assert same == expected


@given(_values_strategy)
def test_a_value_equals_itself_rebuilt_also_nan(value):
    import copy

    assert _values.exact_key(value) == _values.exact_key(copy.deepcopy(value))


def test_types_and_signs_are_told_apart():
    keys = [_values.exact_key(v) for v in (1, 1.0, True, np.int32(1), 0.0, -0.0)]
    assert len(set(keys)) == len(keys)


def test_arrays_are_keyed_by_dtype_shape_weak_type_and_bytes():
    key = _values.exact_key
    assert key(jnp.ones(2)) == key(jnp.ones(2))
    assert key(jnp.ones(2)) != key(jnp.ones(2, jnp.int32))
    assert key(jnp.ones(2)) != key(jnp.ones((2, 1)))
    assert key(jnp.asarray(0.5)) != key(jnp.asarray(0.5, jnp.float32))  # weak vs strong
    assert key(jnp.array([0.0])) != key(jnp.array([-0.0]))
    assert key(jnp.array([jnp.nan])) == key(jnp.array([jnp.nan]))
    assert key(np.ones(2)) != key(jnp.ones(2))  # NumPy and JAX arrays differ in type


def test_containers_are_keyed_by_structure_and_leaves():
    key = _values.exact_key
    assert key({"a": jnp.ones(2)}) == key({"a": jnp.ones(2)})
    assert key([1, 2]) != key((1, 2))
    assert key({"a": 1}) != key({"a": 1.0})


def test_tracers_and_unreadable_values_are_keyed_by_identity():
    @jax.jit
    def f(x):
        assert _values.exact_key(x) == _values.exact_key(x)
        assert type(_values.exact_key(x)) is _values.ByIdentity
        return x

    f(jnp.ones(2))


def test_hashable_key_refuses_unhashable_values_also_inside_tuples():

    with pytest.raises(TypeError):
        _values.hashable_key([1])
    with pytest.raises(TypeError):
        _values.hashable_key((1, {"a": 1}))


@pytest.mark.parametrize(
    "make",
    [
        lambda: tc.Partial(operator.add, float("nan")),
        lambda: tc.Partial(operator.add, np.float32("nan")),
        lambda: tc.Partial(operator.add, jnp.array([jnp.nan])),
        lambda: tc.Partial(operator.add, y=(float("nan"), -0.0)),
        lambda: tc.freeze(float("nan")),
        lambda: Static(float("nan")),
    ],
    ids=["partial-float", "partial-np", "partial-array", "partial-kw", "frozen", "static"],
)
def test_fresh_nan_statics_compile_once(make):
    traces = []

    @jax.jit
    def call(static, x):
        traces.append(None)
        return x

    for _ in range(3):
        call(make(), 1.0)
    assert len(traces) == 1


def test_partial_with_nan_compiles_once_across_fresh_instances():
    traces = []

    @jax.jit
    def call(f, x):
        traces.append(None)
        return f(x)

    for _ in range(3):
        call(tc.Partial(operator.add, float("nan")), 1.0)
    assert len(traces) == 1


def test_signed_zeros_are_different_statics_everywhere():
    traces = []

    @jax.jit
    def call(static, x):
        traces.append(None)
        return x

    for make in (tc.freeze, lambda v: tc.Partial(operator.add, v), Static):
        traces.clear()
        call(make(0.0), 1.0)
        call(make(-0.0), 1.0)
        assert len(traces) == 2


def test_host_bytes_of_prng_keys_are_their_key_data():
    key = jax.random.key(0)
    assert _values.is_prng_key(key) and not _values.is_prng_key(jnp.ones(2))
    expected = np.asarray(jax.random.key_data(key)).tobytes()
    assert _values.host_bytes(key).tobytes() == expected


def test_bool_mask_leaves():
    assert _values.is_bool_mask_leaf(True) and _values.is_bool_mask_leaf(np.bool_(False))
    assert _values.is_bool_mask_leaf(jnp.asarray(True))
    assert not _values.is_bool_mask_leaf(1) and not _values.is_bool_mask_leaf(jnp.ones(2) > 0)


def test_short_repr_is_one_line_cut_and_never_raises():
    class Broken:
        def __repr__(self):
            raise RuntimeError

    assert _values.short_repr("a\nb") == "'a\\nb'"
    assert len(_values.short_repr("x" * 100)) == 40
    assert _values.short_repr(Broken()) == "<Broken object (repr failed: RuntimeError)>"
    assert _values.short_repr(...) == "..."
    assert _values.short_repr("a\nb" * 30, None, str) == "a\nb" * 30  # whole, as printers show it


def test_path_text_names_the_root():
    from jax.tree_util import GetAttrKey, SequenceKey

    assert _values.path_str(Static(1), (GetAttrKey("w"), SequenceKey(0))) == "Static.w[0]"
    assert _values.path_str({}, ()) == "tree"
