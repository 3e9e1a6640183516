"""Path traces: `tree_flatten_with_trace`, `tree_leaves_with_trace`, `tree_map_with_trace`."""

from __future__ import annotations

from collections import OrderedDict, namedtuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import Linear
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.tree_util import DictKey, GetAttrKey, SequenceKey

import treeclass as tc

Point = namedtuple("Point", ["x", "y"])


class Dropout(tc.TreeClass):
    rate: float = 0.5


class Block(tc.TreeClass):
    def __init__(self):
        self.dense = Linear(jnp.ones((2, 2)), jnp.zeros(2))
        self.drop = Dropout()


@jax.tree_util.register_pytree_with_keys_class
class Foreign:
    """A registered node that is not a TreeClass, with its own key entries."""

    def __init__(self, left, right):
        self.left, self.right = left, right

    def tree_flatten_with_keys(self):
        return ((GetAttrKey("left"), self.left), (GetAttrKey("right"), self.right)), "aux"

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)


@jax.tree_util.register_pytree_node_class
class Unkeyed:
    """A node registered without keys: JAX gives its children FlattenedIndexKeys."""

    def __init__(self, *items):
        self.items = items

    def tree_flatten(self):
        return self.items, None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)


def traces(tree, **kwargs):
    return [trace for trace, _ in tc.tree_leaves_with_trace(tree, **kwargs)]


# -- what a trace holds ------------------------------------------------------------------------


def test_trace_through_dicts_and_lists():
    assert traces({"a": [1.0, 2]}) == [
        ((DictKey("a"), SequenceKey(0)), (list, float)),
        ((DictKey("a"), SequenceKey(1)), (list, int)),
    ]


def test_trace_through_namedtuples():
    assert traces(Point(1, (2.0,))) == [
        ((GetAttrKey("x"),), (int,)),
        ((GetAttrKey("y"), SequenceKey(0)), (tuple, float)),
    ]


def test_trace_through_treeclass_nodes_skips_static_fields():
    [(w_keys, w_types), (b_keys, b_types)] = traces(Linear(jnp.ones(2), np.zeros(2)))
    assert w_keys == (GetAttrKey("weight"),) and len(w_types) == 1
    assert issubclass(w_types[0], jax.Array)
    assert b_keys == (GetAttrKey("bias"),) and b_types == (np.ndarray,)


def test_trace_through_foreign_registered_nodes():
    assert traces(Foreign([1], {"k": "v"})) == [
        ((GetAttrKey("left"), SequenceKey(0)), (list, int)),
        ((GetAttrKey("right"), DictKey("k")), (dict, str)),
    ]


def test_trace_through_nodes_registered_without_keys():
    from jax.tree_util import FlattenedIndexKey

    assert traces(Unkeyed(1, (2,))) == [
        ((FlattenedIndexKey(0),), (int,)),
        ((FlattenedIndexKey(1), SequenceKey(0)), (tuple, int)),
    ]


def test_trace_through_ordered_dict_and_nested_treeclass():
    tree = OrderedDict(block=Block())
    assert traces(tree) == [
        (
            (DictKey("block"), GetAttrKey("dense"), GetAttrKey("weight")),
            (Block, Linear, type(jnp.ones(1))),
        ),
        (
            (DictKey("block"), GetAttrKey("dense"), GetAttrKey("bias")),
            (Block, Linear, type(jnp.ones(1))),
        ),
        ((DictKey("block"), GetAttrKey("drop"), GetAttrKey("rate")), (Block, Dropout, float)),
    ]


def test_the_root_type_is_not_in_the_trace():
    [(keys, types)] = traces(Dropout())
    assert keys == (GetAttrKey("rate"),) and types == (float,)
    assert Dropout not in types


def test_types_have_one_entry_per_key():
    for keys, types in traces({"a": [1, {"b": (2,)}], "c": 3}):
        assert len(types) == len(keys)


def test_a_leaf_at_the_root_has_an_empty_trace():
    assert traces(3.0) == [((), ())]
    assert traces(jnp.ones(2)) == [((), ())]


def test_a_root_stopped_by_is_leaf_has_an_empty_trace():
    assert traces([1, 2], is_leaf=lambda x: isinstance(x, list)) == [((), ())]


def test_none_and_empty_containers_have_no_traces():
    assert traces({"a": None, "b": (), "c": [], "d": {}, "e": 1}) == [
        ((DictKey("e"),), (int,)),
    ]
    assert traces(None) == [] and traces(()) == []


def test_is_leaf_stops_the_trace_at_the_chosen_node():
    assert traces({"p": Point(1, 2)}, is_leaf=lambda x: isinstance(x, Point)) == [
        ((DictKey("p"),), (Point,)),
    ]


def test_frozen_values_have_no_trace():
    assert traces({"a": tc.freeze(1.0), "b": 2.0}) == [((DictKey("b"),), (float,))]


def test_flatten_with_trace_returns_the_treedef_and_leaves():
    tree = {"a": [1.0, 2.0], "b": Point(3, 4)}
    traced, treedef = tc.tree_flatten_with_trace(tree)
    assert treedef == jax.tree_util.tree_structure(tree)
    assert [leaf for _, leaf in traced] == [1.0, 2.0, 3, 4]
    assert jax.tree_util.tree_unflatten(treedef, [leaf for _, leaf in traced]) == tree


def test_same_structure_with_different_leaf_types_gets_its_own_leaf_types():
    first, second = (SequenceKey(0),), (SequenceKey(1),)
    assert traces([1, 2.0]) == [(first, (int,)), (second, (float,))]
    assert traces([1.0, 2]) == [(first, (float,)), (second, (int,))]


def test_a_jitted_tree_gets_the_array_types_of_its_new_leaves():
    [(_, types)] = traces(jax.jit(lambda t: t)(Dropout()))
    assert issubclass(types[0], jax.Array)


def test_nodes_with_unhashable_aux_data_are_traced():
    @jax.tree_util.register_pytree_node_class
    class ListAux:
        def __init__(self, x, meta):
            self.x, self.meta = x, meta

        def tree_flatten(self):
            return (self.x,), self.meta  # a list: unhashable aux data

        @classmethod
        def tree_unflatten(cls, meta, children):
            return cls(children[0], meta)

    expected = [(((DictKey("n"), jax.tree_util.FlattenedIndexKey(0)), (ListAux, float)))]
    assert traces({"n": ListAux(1.0, [1, 2])}) == expected
    assert traces({"n": ListAux(1.0, [1, 2])}) == expected
    # array aux data: comparing treedefs raises inside JAX, so the cache is skipped
    assert traces({"n": ListAux(1.0, np.ones(2))}) == expected
    assert traces({"n": ListAux(1.0, np.ones(2))}) == expected


def test_keys_are_jax_key_entries_usable_by_keystr_and_membership():
    ((keys, _),) = traces({"layers": [Linear(jnp.ones(1), jnp.ones(1))]})[:1]
    assert jax.tree_util.keystr(keys) == "['layers'][0].weight"
    assert GetAttrKey("weight") in keys and DictKey("layers") in keys
    assert keys[-1].name == "weight" and str(keys[-1]) == ".weight"


# -- is_trace_leaf -------------------------------------------------------------------------------


def test_is_trace_leaf_stops_at_a_depth():
    tree = {"a": [1, (2, 3)], "b": 4}
    traced = tc.tree_leaves_with_trace(tree, is_trace_leaf=lambda t: len(t[0]) == 2)
    assert traced == [
        (((DictKey("a"), SequenceKey(0)), (list, int)), 1),
        (((DictKey("a"), SequenceKey(1)), (list, tuple)), (2, 3)),
        (((DictKey("b"),), (int,)), 4),
    ]


def test_is_trace_leaf_stops_at_a_type_on_the_path():
    model = {"blocks": [Block()], "head": Linear(jnp.ones(2), jnp.ones(2))}
    traced = tc.tree_leaves_with_trace(model, is_trace_leaf=lambda t: Linear in t[1])
    assert [(jax.tree_util.keystr(keys), leaf) for (keys, _), leaf in traced] == [
        ("['blocks'][0].dense", model["blocks"][0].dense),
        ("['blocks'][0].drop.rate", 0.5),
        ("['head']", model["head"]),
    ]


def test_is_trace_leaf_on_the_root_trace_makes_the_tree_one_leaf():
    tree = {"a": 1}
    assert tc.tree_leaves_with_trace(tree, is_trace_leaf=lambda t: t == ((), ())) == [
        (((), ()), tree)
    ]


def test_is_trace_leaf_gets_each_node_trace_in_order():
    seen = []
    tc.tree_leaves_with_trace(
        {"a": [1, None], "b": Point(2, 3)}, is_trace_leaf=lambda t: seen.append(t) or False
    )
    assert seen == [
        ((), ()),
        ((DictKey("a"),), (list,)),
        ((DictKey("a"), SequenceKey(0)), (list, int)),
        ((DictKey("a"), SequenceKey(1)), (list, type(None))),
        ((DictKey("b"),), (Point,)),
        ((DictKey("b"), GetAttrKey("x")), (Point, int)),
        ((DictKey("b"), GetAttrKey("y")), (Point, int)),
    ]


def test_is_trace_leaf_treedef_has_the_stopped_nodes_as_leaves():
    tree = {"a": [1, 2], "b": (3, [4])}
    traced, treedef = tc.tree_flatten_with_trace(tree, is_trace_leaf=lambda t: len(t[0]) == 1)
    assert treedef == jax.tree_util.tree_structure({"a": 0, "b": 0})
    assert jax.tree_util.tree_unflatten(treedef, [leaf for _, leaf in traced]) == tree


def test_is_leaf_is_asked_before_is_trace_leaf():
    asked = []

    def by_trace(trace):
        asked.append(trace[0])
        return False

    traces({"p": Point(1, 2)}, is_leaf=lambda x: isinstance(x, Point), is_trace_leaf=by_trace)
    assert asked == [()]  # the Point was a leaf by `is_leaf`: its trace was never asked


def test_is_trace_leaf_error_from_the_predicate_propagates():
    with pytest.raises(ZeroDivisionError):
        traces({"a": 1}, is_trace_leaf=lambda t: 1 / 0)


# -- laws: agreement with jax.tree_util and with a node-by-node walk ----------------------------

leaf_values = st.one_of(
    st.integers(-3, 3), st.floats(allow_nan=False), st.text(max_size=2), st.none()
)
trees = st.recursive(
    leaf_values,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.tuples(inner, inner),
        st.dictionaries(st.sampled_from("abcd"), inner, max_size=3),
        st.builds(Point, inner, inner),
        st.builds(Foreign, inner, inner),
        st.builds(lambda w, b: Linear(w, b), inner, inner),
    ),
    max_leaves=10,
)


def walk_traces(tree, is_leaf=None, is_trace_leaf=None):
    """The v0.4 definition, one node at a time: the oracle the cached walk must agree with."""
    out = []

    def visit(node, keys, types):
        if (is_leaf and is_leaf(node)) or (is_trace_leaf and is_trace_leaf((keys, types))):
            out.append(((keys, types), node))
            return
        children, _ = jax.tree_util.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)
        if children == [((), node)]:  # not a node: a leaf
            out.append(((keys, types), node))
            return
        for (key,), child in children:
            visit(child, (*keys, key), (*types, type(child)))

    visit(tree, (), ())
    return out


@settings(max_examples=40, deadline=None)
@given(trees)
def test_trace_keys_and_leaves_are_those_of_tree_flatten_with_path(tree):
    traced, treedef = tc.tree_flatten_with_trace(tree)
    with_path, jax_treedef = jax.tree_util.tree_flatten_with_path(tree)
    assert treedef == jax_treedef
    assert [(keys, leaf) for (keys, _), leaf in traced] == with_path


@settings(max_examples=40, deadline=None)
@given(trees)
def test_there_is_one_type_per_key_ending_with_the_leaf_type(tree):
    for (keys, types), leaf in tc.tree_leaves_with_trace(tree):
        assert len(types) == len(keys)
        if keys:
            assert types[-1] is type(leaf)


@settings(max_examples=40, deadline=None)
@given(trees)
def test_traces_agree_with_a_node_by_node_walk(tree):
    assert tc.tree_leaves_with_trace(tree) == walk_traces(tree)


@settings(max_examples=40, deadline=None)
@given(trees, st.integers(0, 3), st.sampled_from([list, tuple, dict, Point, Foreign, Linear]))
def test_is_trace_leaf_agrees_with_a_node_by_node_walk(tree, depth, kind):
    def stop(trace):
        return len(trace[0]) >= depth and kind in trace[1]

    traced, treedef = tc.tree_flatten_with_trace(tree, is_trace_leaf=stop)
    assert traced == walk_traces(tree, is_trace_leaf=stop)
    assert tc.is_tree_equal(treedef.unflatten([leaf for _, leaf in traced]), tree)


@settings(max_examples=40, deadline=None)
@given(trees)
def test_is_trace_leaf_never_true_gives_the_plain_traces(tree):
    plain = tc.tree_flatten_with_trace(tree)
    assert tc.tree_flatten_with_trace(tree, is_trace_leaf=lambda t: False) == plain


# -- tree_map_with_trace ------------------------------------------------------------------------


def test_map_with_trace_freezes_exactly_the_leaves_under_a_dropout():
    model = {"blocks": [Block(), Block()], "head": Linear(jnp.ones(2), jnp.ones(2))}
    frozen = tc.tree_map_with_trace(
        lambda trace, x: tc.freeze(x) if Dropout in trace[1] else x, model
    )
    assert [tc.is_frozen(b.drop.rate) for b in frozen["blocks"]] == [True, True]
    remaining = jax.tree_util.tree_leaves(frozen)
    assert len(remaining) == len(jax.tree_util.tree_leaves(model)) - 2


def test_map_with_trace_can_select_by_key():
    tree = {"w": 1.0, "b": 2.0, "sub": {"w": 3.0}}
    out = tc.tree_map_with_trace(lambda t, x: x * 10 if t[0][-1] == DictKey("w") else x, tree)
    assert out == {"w": 10.0, "b": 2.0, "sub": {"w": 30.0}}


def test_map_with_trace_passes_leaves_of_the_rest_trees():
    out = tc.tree_map_with_trace(lambda t, x, y, z: x + y + z, (1, [2]), (10, [20]), (100, [200]))
    assert out == (111, [222])


def test_map_with_trace_rest_may_have_the_tree_as_prefix():
    out = tc.tree_map_with_trace(lambda t, x, y: (x, y), {"a": 1}, {"a": [5, 6]})
    assert out == {"a": (1, [5, 6])}


def test_map_with_trace_is_leaf():
    out = tc.tree_map_with_trace(
        lambda t, x: t[1][-1].__name__,
        {"p": Point(1, 2), "q": 3},
        is_leaf=lambda x: isinstance(x, Point),
    )
    assert out == {"p": "Point", "q": "int"}


def test_map_with_trace_is_trace_leaf_passes_whole_nodes_and_rest_subtrees():
    tree = {"a": [1, 2], "b": 3}
    out = tc.tree_map_with_trace(
        lambda t, x, y: (x, y),
        tree,
        {"a": "A", "b": "B"},
        is_trace_leaf=lambda t: len(t[0]) == 1,
    )
    assert out == {"a": ([1, 2], "A"), "b": (3, "B")}


def test_map_with_trace_on_a_bare_leaf_gets_the_empty_trace():
    assert tc.tree_map_with_trace(lambda t, x: (t, x), 2.0) == (((), ()), 2.0)


def test_map_with_trace_works_under_jit():
    tree = {"a": jnp.ones(2), "b": [jnp.ones(2)]}
    out = jax.jit(lambda t: tc.tree_map_with_trace(lambda tr, x: x * len(tr[0]), t))(tree)
    assert out["a"].tolist() == [1.0, 1.0] and out["b"][0].tolist() == [2.0, 2.0]


def test_map_with_trace_error_names_the_leaf():
    def bad(trace, x):
        return x + "s"

    with pytest.raises(TypeError, match=r"raised by `bad` at the leaf `tree\['b'\]\[1\]` \(int\)"):
        tc.tree_map_with_trace(bad, {"a": "ok", "b": ["ok", 2]})


def test_map_with_trace_error_at_a_root_leaf_names_it():
    with pytest.raises(TypeError, match=r"at the leaf `tree` \(str\)"):
        tc.tree_map_with_trace(lambda t, x: x + 1, "s")


def test_map_with_trace_error_with_rest_trees_names_the_leaf():
    with pytest.raises(ZeroDivisionError, match=r"at the leaf `Linear\.weight`"):
        tc.tree_map_with_trace(lambda t, x, y: x / y, Linear(1.0, 2.0), Linear(0.0, 1.0))


def test_map_with_trace_rest_of_another_structure_raises():
    with pytest.raises(ValueError):
        tc.tree_map_with_trace(lambda t, x, y: x, {"a": 1}, {"b": 1})


def test_map_with_trace_leaves_the_input_unchanged():
    tree = {"a": [1.0, 2.0]}
    tc.tree_map_with_trace(lambda t, x: x * 2, tree)
    assert tree == {"a": [1.0, 2.0]}


def _docstring_examples(*objects):
    import inspect
    import re

    return [
        pytest.param(block, id=obj.__name__)
        for obj in objects
        for block in re.findall(r"```python\n(.*?)```", inspect.getdoc(obj), re.S)
    ]


@pytest.mark.parametrize(
    "example",
    _docstring_examples(
        tc.tree_flatten_with_trace, tc.tree_leaves_with_trace, tc.tree_map_with_trace
    ),
)
def test_docstring_examples_run(example):
    exec(compile(example, "<docstring>", "exec"), {})
