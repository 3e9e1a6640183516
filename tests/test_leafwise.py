"""Leafwise operators (`leafwise`, `leafwise=True`) and `bcmap`."""

from __future__ import annotations

import functools
import math
import operator
from collections import namedtuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import treeclass as tc


class Tree(tc.TreeClass, leafwise=True):
    a: int = 1
    b: tuple = (2.0, 3.0)
    c: jax.Array = jnp.array([4.0, 5.0, 6.0])


class IntTree(tc.TreeClass, leafwise=True):
    a: int = 6
    b: jax.Array = jnp.array([3, 12], dtype=jnp.int32)


def assert_same(actual, expected):
    assert jax.tree_util.tree_structure(actual) == jax.tree_util.tree_structure(expected)
    actual_leaves = jax.tree_util.tree_leaves(actual)
    for x, y in zip(actual_leaves, jax.tree_util.tree_leaves(expected), strict=True):
        assert type(x) is type(y)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


ARITHMETIC = [
    operator.add,
    operator.sub,
    operator.mul,
    operator.truediv,
    operator.floordiv,
    operator.mod,
    operator.pow,
]
BITWISE = [operator.lshift, operator.rshift, operator.and_, operator.or_, operator.xor]
COMPARISONS = [operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge]


# -- the reproduction ------------------------------------------------------------


def test_comparison_mask_selects_for_apply_and_prints_exactly(capsys):
    tree = Tree()
    print(tree.at[tree > 1].apply(lambda x: x + 100))
    assert capsys.readouterr().out == "Tree(a=1, b=(102.0, 103.0), c=[104. 105. 106.])\n"


# -- binary operators --------------------------------------------------------------------


@pytest.mark.parametrize("op", ARITHMETIC + COMPARISONS, ids=lambda op: op.__name__)
def test_binary_operator_broadcasts_a_scalar_to_every_leaf(op):
    tree = Tree()
    assert_same(op(tree, 2), jax.tree_util.tree_map(lambda x: op(x, 2), tree))


@pytest.mark.parametrize("op", ARITHMETIC + COMPARISONS, ids=lambda op: op.__name__)
def test_reflected_operator_puts_the_scalar_on_the_left(op):
    tree = Tree()
    assert_same(op(2, tree), jax.tree_util.tree_map(lambda x: op(2, x), tree))


@pytest.mark.parametrize("op", ARITHMETIC + COMPARISONS, ids=lambda op: op.__name__)
def test_binary_operator_with_same_class_maps_leaf_by_leaf(op):
    left, right = Tree(), Tree(a=3, b=(1.0, 7.0), c=jnp.array([2.0, 5.0, 9.0]))
    assert_same(op(left, right), jax.tree_util.tree_map(op, left, right))


@pytest.mark.parametrize("op", BITWISE, ids=lambda op: op.__name__)
def test_bitwise_operators_map_over_int_leaves(op):
    tree = IntTree()
    assert_same(op(tree, 2), jax.tree_util.tree_map(lambda x: op(x, 2), tree))
    assert_same(op(2, tree), jax.tree_util.tree_map(lambda x: op(2, x), tree))
    assert_same(op(tree, tree), jax.tree_util.tree_map(op, tree, tree))


def test_matmul_and_reflected_matmul_map_over_array_leaves():
    class Mats(tc.TreeClass, leafwise=True):
        w: jax.Array = jnp.arange(4.0).reshape(2, 2)
        v: jax.Array = jnp.ones((2, 2))

    eye = jnp.array([[0.0, 1.0], [1.0, 0.0]])
    tree = Mats()
    assert_same(tree @ eye, jax.tree_util.tree_map(lambda x: x @ eye, tree))
    assert_same(eye @ tree, jax.tree_util.tree_map(lambda x: eye @ x, tree))
    assert_same(tree @ tree, jax.tree_util.tree_map(operator.matmul, tree, tree))


def test_binary_operators_work_under_jit():
    tree = Tree()
    out = jax.jit(lambda t: (t + 1) * t - 2 / t)(tree)
    expected = jax.tree_util.tree_map(lambda x: (x + 1) * x - 2 / x, tree)
    leaves = jax.tree_util.tree_leaves(out)
    for x, y in zip(leaves, jax.tree_util.tree_leaves(expected), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6)


@pytest.mark.parametrize("op", ARITHMETIC + BITWISE, ids=lambda op: op.__name__)
def test_reflected_and_bitwise_operators_work_under_jit(op):
    tree = IntTree(a=3, b=jnp.array([1, 2], dtype=jnp.int32))
    out = jax.jit(lambda t: (op(t, 2), op(5, t)))(tree)
    expected = (
        jax.tree_util.tree_map(lambda x: op(x, 2), tree),
        jax.tree_util.tree_map(lambda x: op(5, x), tree),
    )
    for x, y in zip(
        jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(expected), strict=True
    ):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6)


def test_operators_are_differentiable():
    tree = Tree(a=2.0)
    grads = jax.grad(lambda t: jnp.sum((t * t).c) + (t * 3).a + sum((-t).b))(tree)
    assert grads.a == 3.0 and grads.b == (-1.0, -1.0)
    assert grads.c.tolist() == [8.0, 10.0, 12.0]


def test_operators_work_under_vmap():
    batched = Tree(a=jnp.arange(3.0), b=(jnp.ones(3), jnp.zeros(3)), c=jnp.ones((3, 2)))
    out = jax.vmap(lambda t: t * 2 + 1)(batched)
    assert out.a.tolist() == [1.0, 3.0, 5.0] and out.c.shape == (3, 2)


def test_comparisons_under_jit_return_a_bool_tree():
    out = jax.jit(lambda t: t >= 3)(Tree())
    assert [np.asarray(x).tolist() for x in jax.tree_util.tree_leaves(out)] == [
        False,
        False,
        True,
        [True, True, True],
    ]


def test_array_operand_broadcasts_against_every_leaf():
    class Vecs(tc.TreeClass, leafwise=True):
        u: jax.Array = jnp.ones(3)
        v: jax.Array = jnp.zeros(3)

    out = Vecs() + jnp.array([1.0, 2.0, 3.0])
    assert out.u.tolist() == [2.0, 3.0, 4.0] and out.v.tolist() == [1.0, 2.0, 3.0]


def test_divmod_gives_one_tree_of_quotient_remainder_pairs():
    assert_same(divmod(Tree(), 2), jax.tree_util.tree_map(lambda x: divmod(x, 2), Tree()))
    assert divmod(Tree(), 2).a == (0, 1)


def test_reflected_divmod_gives_one_tree_of_pairs():
    assert_same(divmod(7, IntTree()), jax.tree_util.tree_map(lambda x: divmod(7, x), IntTree()))
    assert divmod(7, IntTree()).a == (1, 1)


def test_divmod_of_two_trees_pairs_leaf_by_leaf():
    out = divmod(IntTree(), IntTree(a=4, b=jnp.array([2, 5], dtype=jnp.int32)))
    assert out.a == (1, 2)
    assert [x.tolist() for x in out.b] == [[1, 2], [1, 2]]


def test_three_argument_pow_takes_a_modulus():
    class Ints(tc.TreeClass, leafwise=True):
        a: int = 3
        b: tuple = (4, 5)

    assert pow(Ints(), 2, 5) == Ints(a=4, b=(1, 0))


def test_comparisons_with_same_class_return_bool_leaves():
    out = Tree() == Tree(a=2)
    assert out.a is False and out.b == (True, True) and out.c.tolist() == [True] * 3
    assert (Tree() != Tree(a=2)).a is True


# -- unary operators ---------------------------------------------------------------------


@pytest.mark.parametrize("op", [operator.neg, operator.pos, abs], ids=lambda op: op.__name__)
def test_unary_operator_maps_over_leaves(op):
    tree = Tree(a=-1, b=(2.0, -3.0))
    assert_same(op(tree), jax.tree_util.tree_map(op, tree))


def test_invert_maps_over_int_and_bool_leaves():
    tree = IntTree()
    assert_same(~tree, jax.tree_util.tree_map(operator.invert, tree))


def test_round_with_and_without_ndigits():
    tree = Tree(a=2, b=(1.26, 2.5), c=jnp.array([1.26, 2.5]))
    assert_same(round(tree), jax.tree_util.tree_map(round, tree))
    assert_same(round(tree, 1), jax.tree_util.tree_map(lambda x: round(x, 1), tree))


@pytest.mark.parametrize(
    "mathfn, arrayfn",
    [(math.floor, np.floor), (math.ceil, np.ceil), (math.trunc, np.trunc)],
    ids=["floor", "ceil", "trunc"],
)
def test_math_floor_ceil_trunc_are_elementwise_on_arrays(mathfn, arrayfn):
    values = [1.5, -2.5, 3.0]
    tree = Tree(a=-1.5, b=(2.5, np.array(values)), c=jnp.array(values))
    out = mathfn(tree)
    assert out.a == mathfn(-1.5) and type(out.a) is int
    assert out.b[0] == mathfn(2.5)
    np.testing.assert_array_equal(out.b[1], arrayfn(values))
    assert isinstance(out.c, jax.Array)
    np.testing.assert_array_equal(np.asarray(out.c), arrayfn(values))


def test_unary_operators_work_under_jit():
    out = jax.jit(lambda t: (-t, abs(t), math.floor(t), round(t)))(Tree(b=(-2.5, 3.4)))
    assert [np.asarray(x).tolist() for x in jax.tree_util.tree_leaves(out[2])] == [
        1,
        -3.0,
        3.0,
        [4.0, 5.0, 6.0],
    ]


# -- what is not touched -------------------------------------------------------------------


def test_static_fields_are_kept_and_not_operated_on():
    class Layer(tc.TreeClass, leafwise=True):
        w: jax.Array
        name: str = tc.field(default="layer", static=True)
        size: int = tc.field(default=3, static=True)

    out = Layer(jnp.ones(2)) * 3
    assert out.name == "layer" and out.size == 3 and out.w.tolist() == [3.0, 3.0]


def test_frozen_leaves_are_left_untouched():
    tree = Tree(a=tc.freeze(5), b=(tc.freeze("label"), 1.0))
    out = tree * 2
    assert tc.is_frozen(out.a) and tc.unfreeze(out.a) == 5
    assert tc.unfreeze(out.b[0]) == "label" and out.b[1] == 2.0


def test_none_children_stay_none():
    out = Tree(b=(None, 1.0)) + 1
    assert out.b == (None, 2.0)


def test_method_in_class_body_wins():
    class Custom(tc.TreeClass, leafwise=True):
        x: float = 1.0

        def __add__(self, other):
            return "custom"

    tree = Custom()
    assert tree + 1 == "custom"
    assert (tree * 2).x == 2.0
    assert (1 + tree).x == 2.0  # only the method written in the body is kept


def test_subclass_inherits_operators_and_maps_with_parent_instances():
    class Child(Tree):
        pass

    out = Child() + Child()
    assert type(out) is Child and out.b == (4.0, 6.0)
    assert (Tree() - Tree()).a == 0


def test_inputs_are_unchanged_after_an_operation():
    tree = Tree()
    before = jax.tree_util.tree_leaves(tree)
    _ = tree + 10
    assert all(x is y for x, y in zip(jax.tree_util.tree_leaves(tree), before, strict=True))


def test_leafwise_defaults_to_off():
    class Plain(tc.TreeClass):
        x: float = 1.0

    with pytest.raises(TypeError):
        Plain() + 1
    assert Plain() == Plain()  # structural equality, a Python bool


# -- decorator on other pytree classes ------------------------------------------------------


def test_decorator_on_a_registered_foreign_class():
    @tc.leafwise
    @jax.tree_util.register_pytree_node_class
    class Box:
        def __init__(self, x, y):
            self.x, self.y = x, y

        def tree_flatten(self):
            return (self.x, self.y), None

        @classmethod
        def tree_unflatten(cls, aux, children):
            return cls(*children)

    out = Box(1.0, jnp.ones(2)) * 3 + Box(1.0, jnp.zeros(2))
    assert isinstance(out, Box) and out.x == 4.0 and out.y.tolist() == [3.0, 3.0]
    assert (Box(1.0, 2.0) > 1.5).y is True


def test_decorator_on_a_namedtuple_replaces_tuple_operators():
    Point = tc.leafwise(namedtuple("Point", ["x", "y"]))
    assert Point(1, 2) + Point(10, 20) == Point(11, 22)
    assert tuple(Point(1, 2) * 2) == (2, 4)  # not tuple repetition
    assert tuple(Point(1, 2) < 2) == (True, False)


def test_namedtuple_broadcasts_a_plain_tuple_to_every_leaf():
    Point = tc.leafwise(namedtuple("Point", ["x", "y"]))
    out = Point(np.array(1), np.array(2)) + np.array([5, 6])
    assert out.x.tolist() == [6, 7] and out.y.tolist() == [7, 8]


def test_decorator_returns_the_class_with_named_methods():
    class Box(tc.TreeClass):
        x: float = 1.0

    assert tc.leafwise(Box) is Box
    assert Box.__add__.__qualname__.endswith("Box.__add__")
    assert (Box() + 1).x == 2.0


def test_decorator_on_a_non_class_raises():
    with pytest.raises(TypeError, match="decorates a class.*got a function"):
        tc.leafwise(lambda: None)


# -- errors ----------------------------------------------------------------------------------


def test_error_from_a_leaf_names_its_path():
    with pytest.raises(TypeError, match=r"leafwise `\+` at the leaf `Tree\.a` \(int\)"):
        Tree() + "s"


def test_error_from_a_nested_leaf_names_its_path():
    with pytest.raises(TypeError, match=r"leafwise `-` at the leaf `Tree\.b\[1\]` \(str\)"):
        -Tree(b=(1.0, "s"))


def test_error_from_a_reflected_operator_names_its_path():
    with pytest.raises(TypeError, match=r"leafwise `\*\*` at the leaf `Tree\.b\[0\]`"):
        ("s",) ** Tree(a=tc.freeze(1))


def test_error_in_a_leaf_by_leaf_operation_names_its_path():
    with pytest.raises(TypeError, match=r"leafwise `\+` at the leaf `Tree\.b\[1\]` \(float\)"):
        Tree() + Tree(b=(1.0, "s"))


def test_operands_of_different_structure_raise_showing_both():
    both = r"(?s)same structure.*left: .*\(\*, \*\).*right: .*\(\*, \*, \*\)"
    with pytest.raises(ValueError, match=both):
        Tree() + Tree(b=(1.0, 2.0, 3.0))


# -- laws ------------------------------------------------------------------------------------

ints = st.integers(-1000, 1000)


@settings(max_examples=30, deadline=None)
@given(a=ints, b1=ints, b2=ints, k=ints)
def test_adding_then_subtracting_gives_the_tree_back(a, b1, b2, k):
    tree = Tree(a=a, b=(b1, b2), c=jnp.array([a, b1], dtype=jnp.int32))
    assert tc.is_tree_equal((tree + k) - k, tree)


@settings(max_examples=30, deadline=None)
@given(a=ints, b1=ints, b2=ints)
def test_tree_plus_itself_equals_twice_the_tree(a, b1, b2):
    tree = Tree(a=a, b=(b1, b2), c=jnp.array([b2], dtype=jnp.int32))
    assert tc.is_tree_equal(tree + tree, tree * 2)
    negated = -tree
    assert tc.is_tree_equal(-negated, tree)


@settings(max_examples=30, deadline=None)
@given(a=ints, b1=ints, b2=ints, k=st.integers(1, 50))
def test_divmod_pairs_rebuild_each_leaf(a, b1, b2, k):
    tree = IntTree(a=a, b=jnp.array([b1, b2], dtype=jnp.int32))
    out = divmod(tree, k)
    assert out.a == divmod(a, k)
    quotient, remainder = out.b
    assert (quotient * k + remainder).tolist() == [b1, b2]
    assert ((remainder >= 0) & (remainder < k)).all()


# -- bcmap -----------------------------------------------------------------------------------


def test_bcmap_where_with_a_mask_tree_and_a_scalar():
    tree = Tree()
    out = tc.bcmap(jnp.where)(tree > 2, tree + 100, 0)
    assert out.a.tolist() == 0 and [float(x) for x in out.b] == [0.0, 103.0]
    assert out.c.tolist() == [104.0, 105.0, 106.0]


def test_bcmap_maps_every_tree_argument_leaf_by_leaf():
    tree = {"x": 1.0, "y": [2.0, 3.0]}
    out = tc.bcmap(lambda a, b, c: a * b + c)(tree, tree, 1.0)
    assert out == {"x": 2.0, "y": [5.0, 10.0]}


def test_bcmap_broadcasts_keyword_arguments():
    tree = {"x": jnp.ones((2, 3)), "y": jnp.ones((4, 3))}
    out = tc.bcmap(jnp.sum)(tree, axis=0)
    assert out["x"].shape == (3,) and out["y"].tolist() == [4.0, 4.0, 4.0]


def test_bcmap_maps_tree_keyword_arguments():
    tree = {"x": 1.0, "y": 2.0}
    out = tc.bcmap(lambda a, b=0.0, c=0.0: a - b + c)(tree, b={"x": 10.0, "y": 20.0}, c=0.5)
    assert out == {"x": -8.5, "y": -17.5}


def test_bcmap_first_keyword_argument_fixes_the_structure_without_positional_ones():
    out = tc.bcmap(lambda a, b, c: a + b + c)(
        a={"x": 1.0, "y": 2.0}, b={"x": 10.0, "y": 20.0}, c=0.5
    )
    assert out == {"x": 11.5, "y": 22.5}


def test_bcmap_none_argument_is_broadcast():
    out = tc.bcmap(jnp.sum)({"x": jnp.ones(3)}, axis=None)
    assert out["x"] == 3.0


def test_bcmap_with_a_leaf_first_argument_is_one_plain_call():
    assert tc.bcmap(lambda s, t: (s, t))(2.0, (1.0, 2.0)) == (2.0, (1.0, 2.0))
    assert tc.bcmap(jnp.sum)(jnp.ones((2, 3)), axis=(0, 1)) == 6.0


def test_bcmap_none_first_argument_has_no_leaves():
    assert tc.bcmap(lambda x, y: 1 / 0)(None, {"a": 1}) is None


def test_bcmap_passes_a_tree_of_another_structure_whole_to_every_call():
    out = tc.bcmap(lambda x, y: (x, y))({"a": 1, "b": 2}, {"a": 1})
    assert out == {"a": (1, {"a": 1}), "b": (2, {"a": 1})}


def test_bcmap_passes_a_keyword_tree_of_another_structure_whole():
    out = tc.bcmap(jnp.sum)([jnp.ones((2, 2)), jnp.ones((1, 3))], axis=(0, 1))
    assert [x.tolist() for x in out] == [4.0, 3.0]


def test_bcmap_maps_every_argument_with_the_structure_of_the_first():
    out = tc.bcmap(lambda a, b, c=0: (a, b, c))([1, 2], [3, 4], c=[5, 6])
    assert out == [(1, 3, 5), (2, 4, 6)]


def test_bcmap_is_leaf_applies_to_every_argument():
    out = tc.bcmap(lambda x, y: x + y, is_leaf=lambda v: isinstance(v, tuple))(
        {"p": (1, 2)}, {"p": (3,)}
    )
    assert out == {"p": (1, 2, 3)}


def test_bcmap_broadcast_to_fixes_the_structure_without_tree_arguments():
    out = tc.bcmap(lambda x: x + 1, broadcast_to={"a": 0, "b": (0, 0)})(1)
    assert out == {"a": 2, "b": (2, 2)}
    assert tc.bcmap(lambda: 0, broadcast_to=[1, 2])() == [0, 0]


def test_bcmap_broadcast_to_with_matching_tree_argument():
    out = tc.bcmap(operator.add, broadcast_to=(0, 0))((1, 2), 10)
    assert out == (11, 12)


def test_bcmap_without_tree_arguments_just_calls_func():
    assert tc.bcmap(operator.add)(1, 2) == 3
    assert tc.bcmap(jnp.add)(jnp.ones(2), 1.0).tolist() == [2.0, 2.0]


def test_bcmap_is_leaf_stops_descending():
    tree = {"pair": (1, 2), "x": 3}
    out = tc.bcmap(
        lambda v: len(v) if isinstance(v, tuple) else v, is_leaf=lambda v: isinstance(v, tuple)
    )(tree)
    assert out == {"pair": 2, "x": 3}


def test_bcmap_skips_frozen_leaves():
    tree = {"w": 1.0, "tag": tc.freeze("name")}
    out = tc.bcmap(operator.mul)(tree, 3.0)
    assert out["w"] == 3.0 and tc.unfreeze(out["tag"]) == "name"


def test_bcmap_under_jit():
    tree = Tree()
    out = jax.jit(tc.bcmap(jnp.where))(tree > 2, tree, -1.0)
    assert [np.asarray(x).tolist() for x in jax.tree_util.tree_leaves(out)] == [
        -1.0,
        -1.0,
        3.0,
        [4.0, 5.0, 6.0],
    ]


def test_bcmap_keeps_the_function_name_and_doc():
    def scale(x, k):
        """Scale x by k."""
        return x * k

    mapped = tc.bcmap(scale)
    assert mapped.__name__ == "scale" and mapped.__doc__ == "Scale x by k."


def test_bcmap_with_a_partial_binds_a_container_argument():
    tree = {"x": jnp.ones((2, 3))}
    out = tc.bcmap(tc.Partial(jnp.sum, axis=(0, 1)))(tree)
    assert out["x"] == 6.0
    out = tc.bcmap(functools.partial(jnp.sum, axis=(0, 1)))(tree)
    assert out["x"] == 6.0


def test_bcmap_error_names_a_tree_argument_passed_whole_with_both_structures():
    with pytest.raises(
        TypeError,
        match=r"(?s)passed positional argument 1 whole to every call: its structure differs.*"
        r"positional argument 0: PyTreeDef\(\{'a': \*, 'b': \*\}\).*"
        r"positional argument 1: PyTreeDef\(\{'a': \*\}\)",
    ):
        tc.bcmap(operator.add)({"a": 1, "b": 2}, {"a": 1})


def test_bcmap_error_names_a_keyword_tree_passed_whole():
    with pytest.raises(TypeError, match=r"(?s)keyword argument `k` whole.*PyTreeDef\(\(\*, \*\)\)"):
        tc.bcmap(lambda x, k: x + k)([1], k=(1, 2))


def test_bcmap_error_with_broadcast_to_names_it():
    message = (
        r"(?s)its structure differs from that of broadcast_to.*"
        r"broadcast_to: PyTreeDef\(\(\*,\)\)"
    )
    with pytest.raises(TypeError, match=message):
        tc.bcmap(operator.add, broadcast_to=(0,))((1, 2), 1)


def test_bcmap_error_from_a_leaf_names_its_path():
    message = r"raised by `add` \(in bcmap\) at the leaf `Tree\.b\[1\]`"
    with pytest.raises(TypeError, match=message):
        tc.bcmap(operator.add)(Tree(b=(1.0, "s")), 1.0)


def test_bcmap_error_with_tree_keyword_names_the_leaf_path():
    def sub(a, b):
        return a - b

    with pytest.raises(TypeError, match=r"raised by `sub` \(in bcmap\) at the leaf `tree\['y'\]`"):
        tc.bcmap(sub)({"x": 1, "y": 2}, b={"x": 1, "y": "s"})


def test_bcmap_error_with_broadcast_to_only_names_the_first_leaf():
    with pytest.raises(ZeroDivisionError, match=r"at the leaf `tree\[0\]`"):
        tc.bcmap(lambda: 1 / 0, broadcast_to=(0, 0))()


small_trees = st.recursive(
    st.integers(-100, 100),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from("abc"), inner, max_size=3),
    ),
    max_leaves=6,
)


@settings(max_examples=40, deadline=None)
@given(small_trees, st.integers(-5, 5))
def test_bcmap_with_a_scalar_is_tree_map_with_the_scalar_bound(tree, k):
    if not isinstance(tree, (list, dict)):
        return  # a leaf first argument is a plain call, tested above
    assert tc.bcmap(operator.sub)(tree, k) == jax.tree_util.tree_map(lambda x: x - k, tree)


@settings(max_examples=40, deadline=None)
@given(small_trees)
def test_bcmap_of_same_structure_trees_is_tree_map(tree):
    other = jax.tree_util.tree_map(lambda x: x * 3, tree)
    assert tc.bcmap(operator.sub)(tree, other) == jax.tree_util.tree_map(operator.sub, tree, other)


def _docstring_examples(*objects):
    import inspect
    import re

    return [
        pytest.param(block, id=obj.__name__)
        for obj in objects
        for block in re.findall(r"```python\n(.*?)```", inspect.getdoc(obj), re.S)
    ]


@pytest.mark.parametrize("example", _docstring_examples(tc.leafwise, tc.bcmap))
def test_docstring_examples_run(example):
    exec(compile(example, "<docstring>", "exec"), {})


def test_bcmap_rejects_a_non_callable():
    with pytest.raises(TypeError, match=r"`bcmap` expects a callable `func`, got 3 \(an `int`\)"):
        tc.bcmap(3)


@pytest.mark.parametrize("flag, position", [(True, 1), (False, 0)])
def test_bcmap_broadcast_to_a_bool_is_that_position_as_in_sepes(flag, position):
    sepes = pytest.importorskip("sepes")
    add = lambda x, y: x + y  # noqa: E731
    args = [1, [2, 3]] if position == 1 else [[2, 3], 1]
    assert tc.bcmap(add, broadcast_to=flag)(*args) == [3, 4]
    assert sepes.bcmap(add, broadcast_to=flag)(*args) == [3, 4]


def test_bcmap_broadcast_to_true_without_a_second_argument_names_the_position():
    with pytest.raises(TypeError, match=r"broadcast_to=True\) maps over positional argument 1"):
        tc.bcmap(lambda x: x, broadcast_to=True)([1])
