"""Path traces: `tree_flatten_with_trace`, `tree_leaves_with_trace`, `tree_map_with_trace`."""

from __future__ import annotations

from collections import OrderedDict, namedtuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.tree_util import DictKey, GetAttrKey, SequenceKey

import treeclass as tc

Point = namedtuple("Point", ["x", "y"])


class Linear(tc.TreeClass):
    weight: jax.Array
    bias: jax.Array
    name: str = tc.field(default="linear", static=True)


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
        ((DictKey("a"), SequenceKey(0)), (dict, list, float)),
        ((DictKey("a"), SequenceKey(1)), (dict, list, int)),
    ]


def test_trace_through_namedtuples():
    assert traces(Point(1, (2.0,))) == [
        ((GetAttrKey("x"),), (Point, int)),
        ((GetAttrKey("y"), SequenceKey(0)), (Point, tuple, float)),
    ]


def test_trace_through_treeclass_nodes_skips_static_fields():
    [(w_keys, w_types), (b_keys, b_types)] = traces(Linear(jnp.ones(2), np.zeros(2)))
    assert w_keys == (GetAttrKey("weight"),) and w_types[0] is Linear
    assert issubclass(w_types[1], jax.Array)
    assert b_keys == (GetAttrKey("bias"),) and b_types == (Linear, np.ndarray)


def test_trace_through_foreign_registered_nodes():
    assert traces(Foreign([1], {"k": "v"})) == [
        ((GetAttrKey("left"), SequenceKey(0)), (Foreign, list, int)),
        ((GetAttrKey("right"), DictKey("k")), (Foreign, dict, str)),
    ]


def test_trace_through_nodes_registered_without_keys():
    from jax.tree_util import FlattenedIndexKey

    assert traces(Unkeyed(1, (2,))) == [
        ((FlattenedIndexKey(0),), (Unkeyed, int)),
        ((FlattenedIndexKey(1), SequenceKey(0)), (Unkeyed, tuple, int)),
    ]


def test_trace_through_ordered_dict_and_nested_treeclass():
    tree = OrderedDict(block=Block())
    assert traces(tree) == [
        ((DictKey("block"), GetAttrKey("dense"), GetAttrKey("weight")),
         (OrderedDict, Block, Linear, type(jnp.ones(1)))),
        ((DictKey("block"), GetAttrKey("dense"), GetAttrKey("bias")),
         (OrderedDict, Block, Linear, type(jnp.ones(1)))),
        ((DictKey("block"), GetAttrKey("drop"), GetAttrKey("rate")),
         (OrderedDict, Block, Dropout, float)),
    ]


def test_types_have_one_more_entry_than_keys():
    for keys, types in traces({"a": [1, {"b": (2,)}], "c": 3}):
        assert len(types) == len(keys) + 1


def test_a_leaf_alone_has_an_empty_key_path():
    assert traces(3.0) == [((), (float,))]


def test_none_and_empty_containers_have_no_traces():
    assert traces({"a": None, "b": (), "c": [], "d": {}, "e": 1}) == [
        ((DictKey("e"),), (dict, int)),
    ]


def test_is_leaf_stops_the_trace_at_the_chosen_node():
    assert traces({"p": Point(1, 2)}, is_leaf=lambda x: isinstance(x, Point)) == [
        ((DictKey("p"),), (dict, Point)),
    ]


def test_frozen_values_have_no_trace():
    assert traces({"a": tc.freeze(1.0), "b": 2.0}) == [((DictKey("b"),), (dict, float))]


def test_flatten_with_trace_returns_the_treedef_and_leaves():
    tree = {"a": [1.0, 2.0], "b": Point(3, 4)}
    traced, treedef = tc.tree_flatten_with_trace(tree)
    assert treedef == jax.tree_util.tree_structure(tree)
    assert [leaf for _, leaf in traced] == [1.0, 2.0, 3, 4]
    assert jax.tree_util.tree_unflatten(treedef, [leaf for _, leaf in traced]) == tree


def test_same_structure_with_different_leaf_types_gets_its_own_leaf_types():
    first, second = (SequenceKey(0),), (SequenceKey(1),)
    assert traces([1, 2.0]) == [(first, (list, int)), (second, (list, float))]
    assert traces([1.0, 2]) == [(first, (list, float)), (second, (list, int))]


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

    expected = [((jax.tree_util.FlattenedIndexKey(0),), (ListAux, float))]
    assert traces(ListAux(1.0, [1, 2])) == expected
    assert traces(ListAux(1.0, [1, 2])) == expected
    # array aux data: comparing treedefs raises inside JAX, so the cache is skipped
    assert traces(ListAux(1.0, np.ones(2))) == expected
    assert traces(ListAux(1.0, np.ones(2))) == expected


# -- agreement with jax.tree_util --------------------------------------------------------------

leaf_values = st.one_of(st.integers(-3, 3), st.floats(allow_nan=False), st.text(max_size=2),
                        st.none())
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


def _node_at(tree, keys):
    node = tree
    for key in keys:
        if isinstance(key, DictKey):
            node = node[key.key]
        elif isinstance(key, SequenceKey):
            node = node[key.idx]
        else:
            node = getattr(node, key.name)
    return node


@settings(max_examples=30, deadline=None)
@given(trees)
def test_traces_agree_with_jax_key_paths_and_leaf_order(tree):
    traced, treedef = tc.tree_flatten_with_trace(tree)
    with_path, jax_treedef = jax.tree_util.tree_flatten_with_path(tree)
    assert treedef == jax_treedef
    assert [(keys, leaf) for (keys, _), leaf in traced] == with_path


@settings(max_examples=30, deadline=None)
@given(trees)
def test_trace_types_are_the_types_of_the_nodes_on_the_path(tree):
    for (keys, types), leaf in tc.tree_leaves_with_trace(tree):
        assert types == tuple(type(_node_at(tree, keys[:i])) for i in range(len(keys) + 1))
        assert types[-1] is type(leaf)


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
        lambda t, x: t[1][-1].__name__, {"p": Point(1, 2), "q": 3},
        is_leaf=lambda x: isinstance(x, Point),
    )
    assert out == {"p": "Point", "q": "int"}


def test_map_with_trace_works_under_jit():
    tree = {"a": jnp.ones(2), "b": [jnp.ones(2)]}
    out = jax.jit(lambda t: tc.tree_map_with_trace(lambda tr, x: x * len(tr[0]), t))(tree)
    assert out["a"].tolist() == [1.0, 1.0] and out["b"][0].tolist() == [2.0, 2.0]


def test_map_with_trace_error_names_the_leaf():
    def bad(trace, x):
        return x + "s"

    with pytest.raises(TypeError, match=r"raised by `bad` at the leaf `tree\['b'\]\[1\]` \(int\)"):
        tc.tree_map_with_trace(bad, {"a": "ok", "b": ["ok", 2]})


def test_map_with_trace_error_with_rest_trees_names_the_leaf():
    with pytest.raises(ZeroDivisionError, match=r"at the leaf `tree\.weight`"):
        tc.tree_map_with_trace(
            lambda t, x, y: x / y, Linear(1.0, 2.0), Linear(0.0, 1.0)
        )


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
