"""The node view: one way to open, rebuild, name and describe every kind of node."""

from __future__ import annotations

import collections
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
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
    assert _structure.describe(frozen) == "a frozen value (an array f32[2])"


def test_describe_names_children_and_leaves():
    assert _structure.describe({"a": 1}, _structure.open_node({"a": 1}, _structure.DICT)) == (
        "a `dict` with children ('a')"
    )
    assert _structure.describe(jnp.ones((2, 3))) == "an array f32[2,3]"
    assert _structure.describe(1.5) == "1.5 (a `float`)"
    assert _structure.describe(np.float32(2)) == "np.float32(2.0) (a `numpy.float32`)"
    assert _structure.describe(tc.freeze(None)) == "a frozen value (None)"


def test_first_mismatch_names_the_path_and_both_sides():
    found = _structure.first_mismatch({"a": [1, 2]}, {"a": [1]})
    assert found is not None and jax.tree_util.keystr(found.path) == "['a']"
    assert "missing in the mask: [1]" in found.explain("mask")


@pytest.mark.parametrize("node", _NODES, ids=lambda n: type(n).__name__)
def test_row_child_agrees_with_opening_the_node(node):
    row = _structure.row_of(node)
    opened = row.open(node)
    for entry, child in zip(opened.entries, opened.children):
        assert row.child(node, _structure.entry_name(entry)) == (entry, child)
    for missing in ("zz", 9, -9):
        assert row.child(node, missing) is None


def test_row_child_counts_negative_indices_from_the_end():
    assert _structure.row_of([1, 2, 3]).child([1, 2, 3], -1)[1] == 3
    point = Point(1, 2)
    assert _structure.row_of(point).child(point, -1)[1] == 2


def test_row_child_does_not_find_static_fields():
    class WithStatic(tc.TreeClass):
        w: object
        name: str = tc.field(default="n", static=True)

    row = _structure.row_of(WithStatic(1.0))
    assert row.child(WithStatic(1.0), "name") is None
    assert row.child(WithStatic(1.0), "w")[1] == 1.0
    assert row.static_names(WithStatic(1.0)) == ("name",)
    assert row.static_values(WithStatic(1.0)) == {"name": "n"}


# -- the table of node types: what the printers show ------------------------------------------


@dataclasses.dataclass
class Plain:
    a: object
    hidden: object = dataclasses.field(default=0, repr=False)


class Items(list):
    pass


def add(x, y):
    return x + y


class Shown(tc.TreeClass):
    a: object
    secret: object = tc.field(default=0, repr=False)
    name: str = tc.field(default="n", static=True)


def _row(node):
    return _structure.node_type(node, _structure.node_kind(node))


@pytest.mark.parametrize(
    ("node", "items", "brackets", "type_name"),
    [
        (Shown(1.0), [("a=", ".a", 1.0), ("name=", ".name", "n")], "Shown(...)", "Shown"),
        ({"b": 1, "a": 2}, [("'b': ", "['b']", 1), ("'a': ", "['a']", 2)], "{...}", "dict"),
        ([1], [("", "[0]", 1)], "[...]", "list"),
        ((1,), [("", "[0]", 1)], "(...)", "tuple"),
        (Point(1, 2), [("x=", ".x", 1), ("y=", ".y", 2)], "Point(...)", "Point"),
        (
            collections.OrderedDict(z=1),
            [("'z': ", "['z']", 1)],
            "OrderedDict({...})",
            "OrderedDict",
        ),
        (Plain(1), [("a=", ".a", 1)], "Plain(...)", "Plain"),
        (
            tc.Partial(add, 1, y=2),
            [("", ".func", add), ("", ".args[0]", 1), ("y=", ".keywords['y']", 2)],
            "Partial(...)",
            "Partial",
        ),
        (Items([3]), [("", "[0]", 3)], "Items(...)", "Items"),
    ],
    ids=lambda v: type(v).__name__,
)
def test_each_kind_of_node_has_a_row_that_opens_names_and_brackets_it(
    node, items, brackets, type_name
):
    row = _row(node)
    assert row is not None
    assert row.items(node, False) == items
    opening, closing = row.brackets
    assert (type_name + opening if row.named else opening) + "..." + closing == brackets
    assert row.type_name(node) == type_name


def test_hidden_opens_the_fields_declared_repr_false():
    assert [label for label, _, _ in _row(Shown(1.0)).items(Shown(1.0), True)] == [
        "a=",
        "secret=",
        "name=",
    ]
    assert _row(Plain(1)).items(Plain(1), True) == [("a=", ".a", 1), ("hidden=", ".hidden", 0)]


def test_a_one_element_tuple_keeps_its_comma():
    assert _row((1,)).single_comma and not _row([1]).single_comma
    assert tc.tree_repr((1,)) == "(1,)"


@pytest.mark.parametrize("leaf", [1, "s", None, jnp.ones(2), tc.freeze(1.0), object()])
def test_leaves_and_wrappers_have_no_row(leaf):
    row = _row(leaf)
    assert row is None or row.items(leaf, False) is None


def test_key_text_names_every_jax_key_entry():
    from jax.tree_util import DictKey, FlattenedIndexKey, GetAttrKey, SequenceKey

    assert _structure.key_text(GetAttrKey("w")) == ("w=", ".w")
    assert _structure.key_text(DictKey("a")) == ("'a': ", "['a']")
    assert _structure.key_text(SequenceKey(2)) == ("", "[2]")
    assert _structure.key_text(FlattenedIndexKey(1)) == ("", "[1]")


@pytest.mark.parametrize(
    "node", [n for n in _NODES if n is not None], ids=lambda n: type(n).__name__
)
def test_describe_names_the_kind_and_its_children(node):
    opened = _structure.open_node(node, _structure.node_kind(node))
    text = _structure.describe(node, opened)
    name = type(node).__name__
    article = "an" if name[0].lower() in "aeio" else "a"  # an `OrderedDict`, a `dict`
    assert text.startswith(f"{article} `{name}` with children (")
    assert all(repr(_structure.entry_name(e)) in text for e in opened.entries)


_CONTAINERS = st.recursive(
    st.integers() | st.none(),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text("abc", min_size=1, max_size=2), inner, max_size=3)
        | st.builds(Point, inner, inner)
        | st.builds(Pair, inner, inner)
        | st.builds(lambda d: collections.OrderedDict(d), st.dictionaries(st.text("xy"), inner))
    ),
    max_leaves=12,
)


def _rebuilt(tree):
    """`tree` opened and rebuilt at every level, bottom-up, through the node view."""
    kind = _structure.node_kind(tree)
    opened = _structure.open_node(tree, kind)
    if opened is None:
        return tree
    return _structure.rebuild(tree, kind, opened.aux, [_rebuilt(c) for c in opened.children])


@given(_CONTAINERS)
def test_open_then_rebuild_at_every_level_gives_the_tree_back(tree):
    rebuilt = _rebuilt(tree)
    assert tc.is_tree_equal(rebuilt, tree)
    assert jax.tree_util.tree_structure(rebuilt) == jax.tree_util.tree_structure(tree)
    assert tc.tree_repr(rebuilt) == tc.tree_repr(tree)


# -- a new kind of node needs nothing of the printers ------------------------------------------


class Bag:
    """A container the package has never heard of, registered with JAX by its keys."""

    def __init__(self, **parts):
        self.parts = parts


jax.tree_util.register_pytree_with_keys(
    Bag,
    lambda bag: ([(jax.tree_util.DictKey(k), v) for k, v in sorted(bag.parts.items())], None),
    lambda aux, children: Bag(**dict(zip("ab", children))),
)


def test_a_newly_registered_container_opens_in_every_printer():
    from treeclass._pprint_html import tree_html

    tree = {"bag": Bag(a=jnp.ones(2), b=3)}
    assert tc.tree_repr(tree) == ("{'bag': Bag('a': f32[2](μ=1.00, σ=0.00, ∈[1.00,1.00]), 'b': 3)}")
    assert tc.tree_str(tree) == "{'bag': Bag('a': [1. 1.], 'b': 3)}"
    assert tc.tree_diagram(tree) == (
        "dict\n└── ['bag']:Bag\n    ├── ['a']=f32[2](μ=1.00, σ=0.00, ∈[1.00,1.00])\n    └── ['b']=3"
    )
    summary = tc.tree_summary(tree)
    assert "│ ['bag']['a'] │ f32[2] │" in summary and "│ ['bag']['b'] │ int " in summary
    assert "['bag']:Bag</summary>" in tree_html(tree).replace("&#x27;", "'")


def test_first_mismatch_splits_both_trees_with_is_leaf():
    # two frozen values are two leaves under `is_leaf=tc.is_frozen`: the misfit is the None
    tree = {"f": tc.freeze(jnp.arange(3.0)), "w": jnp.ones(2)}
    other = {"f": tc.freeze(jnp.arange(3.0)), "w": None}
    found = _structure.first_mismatch(tree, other, is_leaf=tc.is_frozen)
    assert found is not None and found.path == (jax.tree_util.DictKey("w"),)
    assert _structure.first_mismatch(tree, dict(tree), is_leaf=tc.is_frozen) is None
