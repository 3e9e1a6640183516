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


def test_a_leaf_equals_its_jitted_self():
    class T(tc.TreeClass):
        a: int
        b: float

    tree = T(0, 1.5)
    assert tc.is_tree_equal(tree, jax.jit(lambda t: t)(tree))
    assert tc.is_tree_equal(jax.jit(lambda t: t)(tree), tree)
    assert tree == jax.jit(lambda t: t)(tree)


def test_python_number_equals_a_0d_jax_array_of_its_value():
    assert tc.is_tree_equal(jnp.array(1.0), 1.0) and tc.is_tree_equal(1, jnp.array(1.0))
    assert tc.is_tree_equal(0.1, jnp.array(0.1))  # 0.1 rounded to float32, as jit does
    assert tc.is_tree_equal(True, jnp.array(1))
    assert not tc.is_tree_equal(1.5, jnp.array(1))
    assert not tc.is_tree_equal(2**40, jnp.array(0))  # out of int32 range: no overflow


def test_python_number_equals_an_array_filled_with_it():
    # a number stands for the array `.at[...].set(number)` gives an array leaf
    assert tc.is_tree_equal(2, jnp.array([2, 2])) and tc.is_tree_equal(jnp.ones((2, 3)), 1.0)
    assert tc.is_tree_equal(np.ones(1), 1.0) and tc.is_tree_equal(0.5, np.full(3, 0.5))
    assert tc.is_tree_equal(0.1, jnp.full(3, 0.1))  # rounded to float32, as jit does
    assert not tc.is_tree_equal(0.1, np.full(3, 0.1, np.float32))  # NumPy: exactly
    assert not tc.is_tree_equal(2, jnp.array([2, 3]))
    assert not tc.is_tree_equal(2**40, jnp.zeros(2, jnp.int32))  # out of range: no overflow
    assert not tc.is_tree_equal(0, jnp.zeros(0)) and not tc.is_tree_equal(0, np.zeros((2, 0)))


def test_a_number_set_at_an_array_leaf_equals_the_tree_built_with_the_number():
    class Pair(tc.TreeClass):
        def __init__(self, a, b):
            self.a, self.b = a, b

    tree = Pair(jnp.array(1), jnp.array([1, 2, 3]))
    assert tc.is_tree_equal(Pair(0, 0), tree.at[...].set(0))
    assert tc.is_tree_equal(Pair(0, 0), jax.jit(lambda t: t.at[...].apply(lambda _: 0))(tree))
    assert jax.jit(tc.is_tree_equal)(Pair(0, 0), tree.at[...].set(0))
    assert not jax.jit(tc.is_tree_equal)(Pair(0, 1), tree.at[...].set(0))


def test_numpy_values_compare_exactly_with_python_numbers():
    assert tc.is_tree_equal(np.float32(1.0), 1.0) and tc.is_tree_equal(1, np.int32(1))
    assert tc.is_tree_equal(np.array(2.5, np.float32), 2.5)
    assert not tc.is_tree_equal(np.float32(0.1), 0.1)  # float32(0.1) is not 0.1


def test_numpy_string_scalar_equals_the_python_string():
    assert tc.is_tree_equal(np.str_("a"), "a")


def test_an_array_never_equals_a_non_numeric_value():
    assert not tc.is_tree_equal(jnp.ones(()), "1")
    assert not tc.is_tree_equal(object(), np.ones(()))


def test_numpy_and_jax_arrays_with_same_contents_are_equal():
    assert tc.is_tree_equal(np.arange(3, dtype=np.int32), jnp.arange(3, dtype=jnp.int32))


def test_int_float_and_bool_leaves_compare_by_value():
    assert tc.is_tree_equal(1, 1.0) and tc.is_tree_equal(1, True)
    assert tc.is_tree_equal((0.0,), (False,))
    assert not tc.is_tree_equal(1, 2.0) and not tc.is_tree_equal(1, "1")


def test_static_values_compare_strictly_by_type():
    class Scaled(tc.TreeClass):
        x: float
        k: object = tc.field(default=1, static=True)

    assert Scaled(1.0, k=1) == Scaled(1, k=1)
    assert Scaled(1.0, k=1) != Scaled(1.0, k=1.0)
    assert Scaled(1.0, k=1) != Scaled(1.0, k=True)


def test_nan_leaves_equal_only_themselves():
    nan = float("nan")
    assert tc.is_tree_equal([nan], [nan])
    assert not tc.is_tree_equal([nan], [float("nan")])


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
    assert Pair(1) == Pair(1.0) and Pair(1) != Pair(2)


def test_equal_treeclasses_with_hashable_leaves_hash_alike():
    assert hash(Pair(1, True)) == hash(Pair(1.0, 1))
    assert hash(Pair(np.int32(3), "s")) == hash(Pair(3, "s"))


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


hashable_leaves = st.one_of(
    st.integers(-3, 3),
    st.sampled_from([0.0, -0.0, 1.0, 2.5, True, False]),
    st.sampled_from(
        [
            np.int32(1),
            np.int64(2),
            np.float32(1.0),
            np.float32(0.1),
            np.float64(2.5),
            np.bool_(True),
        ]
    ),
    st.text(max_size=1),
)


@settings(max_examples=60, deadline=None)
@given(hashable_leaves, hashable_leaves, hashable_leaves, hashable_leaves)
def test_equal_trees_hash_alike(a, b, c, d):
    left, right = Pair(a, (b,)), Pair(c, (d,))
    if left == right:
        assert hash(left) == hash(right)


@settings(max_examples=30, deadline=None)
@given(trees)
def test_a_tree_equals_itself_after_jit(tree):
    numeric = jax.tree_util.tree_map(lambda x: x, tree)
    if any(isinstance(x, str) for x in jax.tree_util.tree_leaves(numeric)):
        return  # strings cannot pass through jit
    assert tc.is_tree_equal(numeric, jax.jit(lambda t: t)(numeric))


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
    with pytest.raises(TypeError, match=r"`Partial` expects a callable `func`, got 3 \(an `int`\)"):
        tc.Partial(3)


def test_partial_has_no_pytree_leaves():
    f = tc.Partial(jnp.add, jnp.ones(2), scale=jnp.zeros(1))
    leaves, treedef = jax.tree_util.tree_flatten(f)
    assert leaves == [] and jax.tree_util.tree_leaves_with_path(f) == []
    assert jax.tree_util.tree_unflatten(treedef, []) is f


def test_partial_with_placeholder_round_trips_through_its_treedef():
    f = tc.Partial(jnp.subtract, ..., jnp.ones(2))
    rebuilt = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(f), [])
    assert rebuilt.args[0] is Ellipsis
    assert rebuilt(jnp.full(2, 5.0)).tolist() == [4.0, 4.0]


def test_partial_is_left_unchanged_by_tree_map():
    f = tc.Partial(jnp.multiply, jnp.ones(2))
    tree = jax.tree_util.tree_map(lambda x: x * 2, {"f": f, "x": 1.0})
    assert tree["f"] is f and tree["x"] == 2.0


def test_partial_passes_through_jit_as_a_pytree_argument():
    f = tc.Partial(jnp.multiply, jnp.array([1.0, 2.0]))
    assert jax.jit(lambda g, x: g(x))(f, 3.0).tolist() == [3.0, 6.0]


def test_partial_with_placeholder_passes_through_jit():
    f = tc.Partial(jnp.subtract, ..., jnp.array(1.0))
    assert jax.jit(lambda g: g(5.0))(f) == 4.0


def test_partial_is_not_differentiated():
    f = tc.Partial(lambda w, x: jnp.sum(w * x), jnp.array([1.0, 2.0]))
    assert jax.grad(lambda g: g(jnp.array([3.0, 4.0])))(f) is f


def test_partial_as_jit_argument_compiles_once_per_distinct_partial():
    traces = []

    def apply(f, x):
        traces.append(1)
        return f(x)

    jitted = jax.jit(apply)
    assert jitted(tc.Partial(jnp.add, jnp.ones(2)), 1.0).tolist() == [2.0, 2.0]
    assert jitted(tc.Partial(jnp.add, jnp.ones(2)), 2.0).tolist() == [3.0, 3.0]
    assert len(traces) == 1
    assert jitted(tc.Partial(jnp.add, jnp.zeros(2)), 2.0).tolist() == [2.0, 2.0]
    assert len(traces) == 2


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


def test_partial_with_unhashable_arguments_is_hashable():
    a, b = tc.Partial(jnp.add, jnp.ones(2)), tc.Partial(jnp.add, jnp.ones(2))
    assert hash(a) == hash(b)
    assert hash(tc.Partial(jnp.add, w=[1])) == hash(tc.Partial(jnp.add, w=[1]))
    assert tc.Partial(jnp.add, w=[1]) == tc.Partial(jnp.add, w=[1])


def test_partial_arguments_compare_strictly_as_static_values():
    assert tc.Partial(abs, 1) != tc.Partial(abs, True)
    assert tc.Partial(abs, 0.0) != tc.Partial(abs, -0.0)
    assert tc.Partial(abs, jnp.ones(2)) != tc.Partial(abs, jnp.ones(2, jnp.int32))
    assert tc.Partial(abs, jnp.ones(2)) != tc.Partial(abs, np.ones(2, np.float32))
    assert tc.Partial(abs, (1, 2)) != tc.Partial(abs, [1, 2])


def test_partial_in_a_treeclass_field_is_part_of_the_structure():
    class Head(tc.TreeClass):
        w: jax.Array
        act: tc.Partial

    head = Head(jnp.ones(2), tc.Partial(jnp.maximum, 0.0))
    assert jax.tree_util.tree_leaves(head) == [head.w]
    assert head == Head(jnp.ones(2), tc.Partial(jnp.maximum, 0.0))
    assert head != Head(jnp.ones(2), tc.Partial(jnp.maximum, 1.0))
    assert jax.jit(lambda h: h.act(h.w - 2))(head).tolist() == [0.0, 0.0]


def test_partial_holding_a_tracer_compares_by_identity():
    out = []

    def check(x):
        a, b = tc.Partial(jnp.add, x), tc.Partial(jnp.add, x * 1)
        out.append((a == a, a == b, hash(a) == hash(tc.Partial(jnp.add, x))))
        return x

    jax.jit(check)(1.0)
    assert out == [(True, False, True)]


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


partial_arguments = st.one_of(
    st.integers(-2, 2),
    st.sampled_from([0.0, -0.0, 1.0, True, "s", None, (1,), [1], {"k": 1}]),
    st.sampled_from([np.ones(2, np.float32), np.ones(2, np.int32), np.zeros(2, np.float32)]),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(partial_arguments, max_size=3), st.lists(partial_arguments, max_size=3))
def test_equal_partials_hash_alike(left, right):
    a, b = tc.Partial(print, *left), tc.Partial(print, *right)
    if a == b:
        assert hash(a) == hash(b)
    assert a == tc.Partial(print, *left) and hash(a) == hash(tc.Partial(print, *left))


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
    assert jax.tree_util.tree_leaves(outer) == []
    assert outer == tc.Partial(tc.Partial(inner.func, 1), ..., 3)


def test_partial_with_a_callable_tree_as_function_compares_without_error():
    class Scale(tc.TreeClass, leafwise=True):
        k: float = 2.0

        def __call__(self, x):
            return x * self.k

    module = Scale()
    assert tc.Partial(module, 1.0) == tc.Partial(module, 1.0)
    assert tc.Partial(module, 1.0) == tc.Partial(Scale(), 1.0)
    assert tc.Partial(module, 1.0) != tc.Partial(Scale(k=3.0), 1.0)
    assert tc.Partial(module, 1.0)() == 2.0
