"""The node view: one way to open, rebuild, name and describe every kind of node."""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import pytest
from hypothesis import given
from hypothesis import strategies as st

import treeclass as tc
from treeclass import _structure

pytestmark = pytest.mark.usefixtures("strict_jax")


class Pair(tc.TreeClass):
    a: object
    b: object


Point = collections.namedtuple("Point", ["x", "y"])

_NODES = [
    Pair(1.0, jnp.ones(2)),
    {"b": 1, "a": 2},
    [1, 2.0],
    (1, (2,)),
    Point(1, 2),
    None,
    collections.OrderedDict(z=1, y=2),
]


@pytest.mark.parametrize("node", _NODES, ids=lambda n: type(n).__name__)
def test_open_gives_jax_key_entries_and_rebuild_inverts_it(node):
    kind = _structure.node_kind(node)
    opened = _structure.open_node(node, kind)
    assert opened is not None
    expected = jax.tree_util.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)[0]
    assert [e for e, _ in zip(opened.entries, opened.children)] == [p[0] for p, _ in expected]
    rebuilt = _structure.rebuild(node, kind, opened.aux, opened.children)
    assert type(rebuilt) is type(node)
    assert jax.tree_util.tree_structure(rebuilt) == jax.tree_util.tree_structure(node)


@given(st.recursive(st.integers(), lambda k: st.lists(k, max_size=3) | st.tuples(k, k)))
def test_open_and_rebuild_round_trip_any_nesting(tree):
    kind = _structure.node_kind(tree)
    opened = _structure.open_node(tree, kind)
    if opened is None:
        assert _structure.is_leaf_node(tree)
        return
    assert _structure.rebuild(tree, kind, opened.aux, opened.children) == tree


def test_frozen_values_are_wrappers_of_the_node_view():
    frozen = tc.freeze(jnp.ones(2))
    wrapper = _structure.wrapper_of(frozen)
    assert wrapper is not None and wrapper.mark == "#" and wrapper.maker == "freeze"
    assert wrapper.unwrap(frozen) is tc.unfreeze(frozen)
    assert _structure.wrapper_of(jnp.ones(2)) is None
    assert _structure.describe(frozen, None).startswith("a frozen value (#f32[2]")


def test_describe_names_children_and_leaves():
    assert _structure.describe({"a": 1}, _structure.open_node({"a": 1}, _structure.DICT)) == (
        "a `dict` with children ('a')"
    )
    assert _structure.describe(jnp.ones((2, 3)), None) == "a leaf, an array float32[2, 3]"


def test_first_mismatch_names_the_path_and_both_sides():
    found = _structure.first_mismatch({"a": [1, 2]}, {"a": [1]})
    assert found is not None and jax.tree_util.keystr(found.path) == "['a']"
    assert "missing in the mask: [1]" in found.explain("mask")


@pytest.mark.parametrize("node", _NODES, ids=lambda n: type(n).__name__)
def test_child_by_entry_agrees_with_opening_the_node(node):
    from jax.tree_util import DictKey, GetAttrKey, SequenceKey

    opened = _structure.open_node(node, _structure.node_kind(node))
    for entry, child in zip(opened.entries, opened.children):
        assert _structure.child_by_entry(node, entry) == (True, child)
    for missing in (GetAttrKey("zz"), DictKey("zz"), DictKey(["unhashable"]), SequenceKey(9)):
        assert _structure.child_by_entry(node, missing) == (False, None)


def test_child_by_entry_does_not_find_static_fields():
    from jax.tree_util import GetAttrKey

    class WithStatic(tc.TreeClass):
        w: object
        name: str = tc.field(default="n", static=True)

    assert _structure.child_by_entry(WithStatic(1.0), GetAttrKey("name")) == (False, None)
    assert _structure.child_by_entry(WithStatic(1.0), GetAttrKey("w")) == (True, 1.0)
