"""`is_tree_equal` and `Partial`."""

from __future__ import annotations

import copy
import functools
import pickle
from collections import namedtuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import treeclass as tc


class Pair(tc.TreeClass):
    a: object
    b: object = None


# -- is_tree_equal ---------------------------------------------------------------------------


def test_equal_trees_with_arrays_are_equal():
    assert tc.is_tree_equal({"a": jnp.ones(2), "b": [1, "x"]}, {"a": jnp.ones(2), "b": [1, "x"]})


def test_different_values_are_not_equal():
    assert not tc.is_tree_equal({"a": jnp.ones(2)}, {"a": jnp.zeros(2)})


def test_different_shapes_are_not_equal():
    assert not tc.is_tree_equal(jnp.ones(2), jnp.ones(3))
    assert not tc.is_tree_equal(jnp.ones((1, 2)), jnp.ones(2))


def test_different_dtypes_are_not_equal():
    assert not tc.is_tree_equal(jnp.ones(2, jnp.float32), jnp.ones(2, jnp.int32))
    assert not tc.is_tree_equal(np.ones(2, np.float64), np.ones(2, np.float32))


def test_array_never_equals_a_python_scalar():
    assert not tc.is_tree_equal(jnp.array(1.0), 1.0)
    assert not tc.is_tree_equal(1.0, jnp.array(1.0))
    assert not tc.is_tree_equal(np.float32(1.0), 1.0)


def test_numpy_and_jax_arrays_with_same_contents_are_equal():
    assert tc.is_tree_equal(np.arange(3, dtype=np.int32), jnp.arange(3, dtype=jnp.int32))


def test_int_float_and_bool_scalars_are_not_equal():
    assert not tc.is_tree_equal(1, 1.0)
    assert not tc.is_tree_equal(1, True)
    assert not tc.is_tree_equal((0.0,), (False,))
    assert tc.is_tree_equal((1, 2.0, True), (1, 2.0, True))


def test_different_structures_are_not_equal():
    assert not tc.is_tree_equal({"a": 1}, {"b": 1})
    assert not tc.is_tree_equal([1, 2], (1, 2))
    assert not tc.is_tree_equal([1], [1, 1])
    assert not tc.is_tree_equal(Pair(1, None), Pair(1, 2))


def test_namedtuples_of_different_types_are_not_equal():
    A = namedtuple("A", ["x"])
    B = namedtuple("B", ["x"])
    assert tc.is_tree_equal(A(1), A(1))
    assert not tc.is_tree_equal(A(1), B(1))


def test_returns_python_bool_eagerly():
    assert tc.is_tree_equal(jnp.ones(2), jnp.ones(2)) is True
    assert tc.is_tree_equal(jnp.ones(2), jnp.zeros(2)) is False
    assert tc.is_tree_equal(1, 2) is False


def test_returns_traced_bool_under_jit():
    seen = []

    def check(x, y):
        result = tc.is_tree_equal({"x": x, "k": 1}, {"x": y, "k": 1})
        seen.append(isinstance(result, jax.core.Tracer))
        return result

    assert bool(jax.jit(check)(jnp.ones(3), jnp.ones(3))) is True
    assert bool(jax.jit(check)(jnp.ones(3), jnp.zeros(3))) is False
    assert seen[0] is True


def test_under_jit_several_traced_leaves_are_all_checked():
    def check(x, y):
        return tc.is_tree_equal((x, x * 2), (x, y))

    assert bool(jax.jit(check)(jnp.ones(2), jnp.full(2, 2.0))) is True
    assert bool(jax.jit(check)(jnp.ones(2), jnp.ones(2))) is False


def test_under_jit_a_static_difference_is_a_python_false():
    out = []
    jax.jit(lambda x: out.append(tc.is_tree_equal((x, 1), (x, 2))) or x)(jnp.ones(2))
    assert out == [False]


def test_under_jit_shape_mismatch_is_a_python_false():
    out = []
    jax.jit(lambda x, y: out.append(tc.is_tree_equal(x, y)) or x)(jnp.ones(2), jnp.ones(3))
    assert out == [False]


def test_traced_python_scalar_leaf_under_jit():
    result = jax.jit(lambda x: tc.is_tree_equal(x, jnp.asarray(1.0, jnp.float32)))(1.0)
    assert bool(result) is True


def test_shared_nan_array_is_equal_to_itself():
    nan = jnp.array([jnp.nan])
    assert tc.is_tree_equal({"a": nan}, {"a": nan})
    assert not tc.is_tree_equal({"a": nan}, {"a": jnp.array([jnp.nan])})


def test_fewer_than_two_trees_are_equal():
    assert tc.is_tree_equal() is True
    assert tc.is_tree_equal({"a": 1}) is True


def test_more_than_two_trees_must_all_be_equal():
    assert tc.is_tree_equal([1], [1], [1])
    assert not tc.is_tree_equal([1], [1], [2])


def test_leaf_whose_eq_raises_or_returns_array_counts_as_different():
    class Weird:
        def __eq__(self, other):
            raise RuntimeError("no")

    class ArrayEq:
        def __eq__(self, other):
            return np.array([True, False])

    assert not tc.is_tree_equal(Weird(), Weird())
    assert not tc.is_tree_equal(ArrayEq(), ArrayEq())


def test_treeclass_eq_uses_tree_equality():
    assert Pair(jnp.ones(2), "x") == Pair(jnp.ones(2), "x")
    assert Pair(jnp.ones(2), "x") != Pair(jnp.ones(2), "y")
    assert Pair(1) != Pair(1.0)


def test_frozen_values_compare_by_value():
    assert tc.is_tree_equal({"a": tc.freeze(jnp.ones(2))}, {"a": tc.freeze(jnp.ones(2))})
    assert not tc.is_tree_equal({"a": tc.freeze(1)}, {"a": tc.freeze(2)})


leaf_values = st.one_of(
    st.integers(-5, 5),
    st.floats(allow_nan=False, width=32),
    st.booleans(),
    st.text(max_size=3),
    st.lists(st.floats(-10, 10, width=32), min_size=0, max_size=3).map(
        lambda v: np.asarray(v, np.float32)
    ),
)
trees = st.recursive(
    leaf_values,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.tuples(inner, inner),
        st.dictionaries(st.sampled_from("abc"), inner, max_size=3),
    ),
    max_leaves=8,
)


@settings(max_examples=30, deadline=None)
@given(trees)
def test_a_tree_equals_its_copy(tree):
    assert tc.is_tree_equal(tree, copy.deepcopy(tree))


@settings(max_examples=30, deadline=None)
@given(trees, trees)
def test_equality_is_symmetric(left, right):
    assert tc.is_tree_equal(left, right) == tc.is_tree_equal(right, left)


# -- Partial ---------------------------------------------------------------------------------


def test_partial_prepends_bound_arguments():
    assert tc.Partial(divmod, 7)(2) == (3, 1)


def test_partial_placeholder_is_filled_by_the_call():
    assert tc.Partial(divmod, ..., 2)(7) == (3, 1)


def test_partial_several_placeholders_are_filled_in_order_and_extras_appended():
    f = tc.Partial(lambda *a: a, ..., "b", ..., "d")
    assert f(1, 2, 3, 4) == (1, "b", 2, "d", 3, 4)


def test_partial_keywords_are_merged_and_call_keywords_win():
    f = tc.Partial(lambda a, *, k=0, m=0: (a, k, m), k=1, m=2)
    assert f(0) == (0, 1, 2)
    assert f(0, m=5) == (0, 1, 5)


def test_partial_too_few_arguments_for_placeholders_raises():
    f = tc.Partial(lambda a, b, c: a, ..., 1, ...)
    with pytest.raises(TypeError, match=r"2 placeholder\(s\) `...` to fill.*only 1 positional"):
        f(0)


def test_partial_needs_a_callable():
    with pytest.raises(TypeError, match="needs a callable `func`, got a int"):
        tc.Partial(3)


def test_partial_is_a_pytree_whose_array_arguments_are_leaves():
    f = tc.Partial(jnp.add, jnp.ones(2), scale=jnp.zeros(1))
    leaves_with_path = jax.tree_util.tree_leaves_with_path(f)
    assert [jax.tree_util.keystr(p) for p, _ in leaves_with_path] == [
        ".args[0]", ".keywords['scale']",
    ]


def test_partial_function_and_placeholders_are_static():
    f = tc.Partial(jnp.subtract, ..., jnp.ones(2))
    leaves, treedef = jax.tree_util.tree_flatten(f)
    assert len(leaves) == 1
    rebuilt = jax.tree_util.tree_unflatten(treedef, [jnp.full(2, 3.0)])
    assert rebuilt.func is jnp.subtract and rebuilt.args[0] is Ellipsis
    assert rebuilt(jnp.full(2, 5.0)).tolist() == [2.0, 2.0]


def test_partial_tree_map_updates_its_arguments():
    f = tc.Partial(jnp.multiply, jnp.ones(2))
    doubled = jax.tree_util.tree_map(lambda x: x * 2, f)
    assert doubled(3.0).tolist() == [6.0, 6.0]


def test_partial_passes_through_jit_as_a_pytree_argument():
    f = tc.Partial(jnp.multiply, jnp.array([1.0, 2.0]))
    assert jax.jit(lambda g, x: g(x))(f, 3.0).tolist() == [3.0, 6.0]


def test_partial_with_placeholder_passes_through_jit():
    f = tc.Partial(jnp.subtract, ..., jnp.array(1.0))
    assert jax.jit(lambda g: g(5.0))(f) == 4.0


def test_partial_works_under_grad():
    f = tc.Partial(lambda w, x: jnp.sum(w * x), jnp.array([1.0, 2.0]))
    grads = jax.grad(lambda g: g(jnp.array([3.0, 4.0])))(f)
    assert grads.args[0].tolist() == [3.0, 4.0]


def test_partial_as_jit_static_argument_hits_the_cache():
    traces = []

    def apply(f, x):
        traces.append(1)
        return f(x)

    jitted = jax.jit(apply, static_argnums=0)
    assert jitted(tc.Partial(jnp.add, 1.0), 2.0) == 3.0
    assert jitted(tc.Partial(jnp.add, 1.0), 5.0) == 6.0
    assert len(traces) == 1
    assert jitted(tc.Partial(jnp.add, 2.0), 5.0) == 7.0
    assert len(traces) == 2


def test_partial_equal_partials_are_equal_and_hash_alike():
    a = tc.Partial(max, 1, ..., key=abs)
    b = tc.Partial(max, 1, ..., key=abs)
    assert a == b and hash(a) == hash(b)
    assert a != tc.Partial(max, 2, ..., key=abs)
    assert a != tc.Partial(min, 1, ..., key=abs)
    assert a != tc.Partial(max, 1, key=abs)
    assert a != tc.Partial(max, 1.0, ..., key=abs)
    assert a != functools.partial(max, 1, key=abs)


def test_partial_with_equal_arrays_compares_equal():
    assert tc.Partial(jnp.add, jnp.ones(2)) == tc.Partial(jnp.add, jnp.ones(2))
    assert tc.Partial(jnp.add, jnp.ones(2)) != tc.Partial(jnp.add, jnp.zeros(2))


def test_partial_with_an_array_argument_is_unhashable_with_a_clear_error():
    with pytest.raises(TypeError, match=r"argument `args\[0\]` is an unhashable .*Array"):
        hash(tc.Partial(jnp.add, jnp.ones(2)))
    with pytest.raises(TypeError, match=r"argument `w=` is an unhashable list"):
        hash(tc.Partial(jnp.add, w=[1]))


def test_partial_is_immutable():
    f = tc.Partial(abs)
    with pytest.raises(AttributeError, match="Partial is immutable"):
        f.func = min
    f.keywords["x"] = 1  # a copy
    assert f.keywords == {}


def test_partial_repr_shows_function_arguments_and_placeholders():
    expected = "Partial(max, 1, ..., key=<built-in function abs>)"
    assert repr(tc.Partial(max, 1, ..., key=abs)) == expected


def test_partial_pickles_and_copies():
    f = tc.Partial(max, 1, ..., key=abs)
    assert pickle.loads(pickle.dumps(f)) == f
    assert copy.copy(f) == f and copy.deepcopy(f) == f
    assert pickle.loads(pickle.dumps(f))(5) == 5


def _docstring_examples(*objects):
    import inspect
    import re

    return [
        pytest.param(block, id=obj.__name__)
        for obj in objects
        for block in re.findall(r"```python\n(.*?)```", inspect.getdoc(obj), re.S)
    ]


@pytest.mark.parametrize("example", _docstring_examples(tc.is_tree_equal, tc.Partial))
def test_docstring_examples_run(example):
    exec(compile(example, "<docstring>", "exec"), {})


def test_partial_nested_partial_calls_through():
    inner = tc.Partial(lambda a, b, c: (a, b, c), 1)
    outer = tc.Partial(inner, ..., 3)
    assert outer(2) == (1, 2, 3)
    assert len(jax.tree_util.tree_leaves(outer)) == 1  # only the outer args: inner is static


def test_partial_with_a_callable_tree_as_function_compares_without_error():
    class Scale(tc.TreeClass, leafwise=True):
        k: float = 2.0

        def __call__(self, x):
            return x * self.k

    module = Scale()
    assert tc.Partial(module, 1.0) == tc.Partial(module, 1.0)
    assert tc.Partial(module, 1.0)() == 2.0
