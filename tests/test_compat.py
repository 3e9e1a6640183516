"""PyTreeClass code runs unchanged: one section per compatibility item of issue 14.

Every test here is written the way PyTreeClass users write code (`import treeclass as tc`
in place of `import pytreeclass as tc`, `@tc.autoinit`, `tc.field(on_setattr=...)`,
`tree.at[...]`, `tc.tree_map_with_trace` with `Dropout in trace[1]`), so a failure means a
PyTreeClass program would break. The tests are our own, not PyTreeClass's. A section is
headed `# -- <item>: <what>`; add new items as new sections, one test per behaviour.
Deliberate differences from PyTreeClass are listed in docs/migrating.md, not tested here.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import treeclass as tc

# -- 14.9: leaf semantics -------------------------------------------------------------------


def test_tree_equals_itself_after_jit_turned_its_leaves_into_arrays():
    @tc.autoinit
    class Tree(tc.TreeClass):
        a: int
        b: float

    tree = Tree(0, 0.5)
    jitted = jax.jit(lambda t: t)(tree)
    assert isinstance(jitted.a, jax.Array)
    assert tc.is_tree_equal(tree, jitted)
    assert tc.is_tree_equal(jitted, tree)


def test_is_tree_equal_compares_int_and_float_leaves_by_value():
    @tc.autoinit
    class Tree(tc.TreeClass):
        a: int = 1

    assert tc.is_tree_equal(Tree(1), Tree(1.0))
    assert Tree(1) == Tree(1.0) and hash(Tree(1)) == hash(Tree(1.0))


def test_is_tree_equal_arrays_need_the_same_shape_and_dtype():
    assert not tc.is_tree_equal(jnp.ones(2), jnp.ones(3))
    assert not tc.is_tree_equal(jnp.ones(2), jnp.ones(2, dtype=jnp.int32))
    assert not tc.is_tree_equal(jnp.array([jnp.nan]), jnp.array([jnp.nan]))


def test_is_tree_equal_under_jit_is_a_traced_bool():
    assert jax.jit(lambda x, y: tc.is_tree_equal(x, y))(jnp.ones(2), jnp.ones(2))


def test_divmod_of_a_leafwise_tree_gives_one_tree_of_pairs():
    @tc.leafwise
    @tc.autoinit
    class Tree(tc.TreeClass):
        a: int = 7
        b: float = 9.0

    assert divmod(Tree(), 2) == Tree(a=(3, 1), b=(4.0, 1.0))
    assert divmod(20, Tree()) == Tree(a=(2, 6), b=(2.0, 2.0))


def test_bcmap_broadcasts_an_argument_of_another_structure():
    assert tc.bcmap(lambda x, y: x + y)([1, 2, 3], 1) == [2, 3, 4]
    assert tc.bcmap(lambda x, y: x + y)([1, 2, 3], [1, 2, 3]) == [2, 4, 6]
    with pytest.raises(TypeError, match="unsupported operand type"):
        tc.bcmap(lambda x, y: x + y)([1, 2, 3], [[1, 2, 3], [1, 2, 3]])


def test_bcmap_where_on_a_leafwise_tree():
    @tc.autoinit
    @tc.leafwise
    class Test(tc.TreeClass):
        a: tuple = (1, 2, 3)
        b: tuple = (4, 5, 6)
        c: jax.Array = jnp.array([1, 2, 3])

    tree = Test()
    out = tc.bcmap(jnp.where)(tree > 1, tree, 0)
    assert [x.tolist() for x in jax.tree_util.tree_leaves(out)] == [
        0, 2, 3, 4, 5, 6, [0, 2, 3],
    ]


def test_bcmap_with_only_keyword_arguments_maps_over_the_first():
    out = tc.bcmap(lambda x, y: x * y)(x={"a": 1, "b": 2}, y=10)
    assert out == {"a": 10, "b": 20}


def test_partial_has_no_leaves_and_is_hashable_and_comparable():
    def f(a, b, c):
        return a + b + c

    f_a = tc.Partial(f, ..., 2, 3)
    assert f_a(1) == 6
    assert tc.Partial(f, b=2, c=3)(1) == 6
    assert jax.tree_util.tree_leaves(f_a) == []
    assert f_a == tc.Partial(f, ..., 2, 3) and hash(f_a) == hash(tc.Partial(f, ..., 2, 3))
    assert jax.jit(lambda g, x: g(x))(f_a, 1.0) == 6.0


# -- path traces: the PyTreeClass v0.4 semantics ----------------------------------------------


@tc.autoinit
class Linear(tc.TreeClass):
    weight: jax.Array = jnp.ones((2, 2))
    bias: jax.Array = jnp.zeros(2)


@tc.autoinit
class Dropout(tc.TreeClass):
    drop_rate: float = 0.5


class Net(tc.TreeClass):
    def __init__(self):
        self.l1 = Linear()
        self.drop = Dropout()
        self.l2 = Linear()


def test_map_with_trace_freezes_every_leaf_inside_a_dropout():
    net = tc.tree_map_with_trace(
        lambda trace, leaf: tc.freeze(leaf) if Dropout in trace[1] else leaf, Net()
    )
    assert tc.is_frozen(net.drop.drop_rate)
    assert not tc.is_frozen(net.l1.weight)


def test_trace_names_are_key_entries_and_types_start_below_the_root():
    [(names, types), _] = tc.tree_leaves_with_trace(Net())[0]
    assert names == (jax.tree_util.GetAttrKey("l1"), jax.tree_util.GetAttrKey("weight"))
    assert types[0] is Linear and len(types) == len(names)
    assert Net not in types


def test_map_with_trace_selects_by_a_name_on_the_path():
    def scale_biases(trace, leaf):
        names, _ = trace
        return leaf + 100 if jax.tree_util.GetAttrKey("bias") in names else leaf

    net = tc.tree_map_with_trace(scale_biases, Net())
    assert net.l1.bias.tolist() == [100.0, 100.0] and net.l1.weight.tolist()[0] == [1.0, 1.0]


def test_map_with_trace_selects_by_dict_key_and_list_type():
    tree = {"a": [1, 2], "b": 4, "c": [5, 6]}
    by_key = tc.tree_map_with_trace(
        lambda t, x: x + 100 if jax.tree_util.DictKey("a") in t[0] else x, tree
    )
    assert by_key == {"a": [101, 102], "b": 4, "c": [5, 6]}
    by_type = tc.tree_map_with_trace(lambda t, x: x + 100 if list in t[1] else x, tree)
    assert by_type == {"a": [101, 102], "b": 4, "c": [105, 106]}


def test_a_bare_leaf_has_an_empty_trace():
    assert tc.tree_leaves_with_trace(1) == [(((), ()), 1)]


def test_leaves_with_trace_is_trace_leaf_stops_at_a_depth():
    traced = tc.tree_leaves_with_trace(Net(), is_trace_leaf=lambda trace: len(trace[0]) == 1)
    assert [type(leaf) for _, leaf in traced] == [Linear, Dropout, Linear]
