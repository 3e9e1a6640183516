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


# -- a new kind of node is one row: two kinds the package has never heard of ------------------
#
# `Rows` keeps one array for JAX but shows `.at` one child per row (as a stack of blocks
# does), with a static name; `Veiled` wraps one value in a node without children (as a
# frozen value does). Each is a class, its JAX registration and one row of the table of
# node kinds (`register_kind`), here, in a test file: the walker, the selectors, method
# calls, every printer and `tc.roles` handle both with no change to the package.

from jax.tree_util import GetAttrKey, SequenceKey  # noqa: E402

from treeclass._pprint_html import Printed, tree_html, wrapper_treescope_repr  # noqa: E402


class Rows(Printed):
    """The rows of one 2-d array, with a static name; JAX sees one leaf, `.data`."""

    def __init__(self, data, name="rows"):
        self.data = data
        self.name = name

    def grow(self, by):  # a mutating method, for `.at["method"](...)`
        self.data = self.data + by
        return by


jax.tree_util.register_pytree_with_keys(
    Rows,
    lambda rows: ([(GetAttrKey("data"), rows.data)], rows.name),
    lambda name, children: Rows(children[0], name),
    lambda rows: ([rows.data], rows.name),
)


class RowsKind(_structure.NodeKind):
    brackets = ("<", ">")

    def layers(self, node):  # one layer per row, for per-layer checkpoint names
        return _structure.Layers(len(node.data))

    def open(self, node):
        n = len(node.data)
        return _structure.Opened(
            tuple(SequenceKey(i) for i in range(n)), [node.data[i] for i in range(n)], None
        )

    def child(self, node, key):
        n = len(node.data)
        if type(key) is not int or not -n <= key < n:
            return None
        return SequenceKey(key % n), node.data[key % n]

    def replace(self, node, entry, old, new, path=(), where=jax.tree_util.keystr):
        if jnp.shape(new) != jnp.shape(old):
            raise ValueError(f"{where(path + (entry,))}: a row of shape {jnp.shape(old)} is needed")
        return Rows(node.data.at[entry.idx].set(new), node.name)

    def rebuild(self, node, aux, children, partial=False, path=(), where=jax.tree_util.keystr):
        if partial and (
            any(c is None for c in children) or len({np.shape(c) for c in children}) > 1
        ):
            return tuple(children)  # a `get` with fill values that are not rows
        return Rows(jnp.stack([jnp.asarray(c) for c in children]), node.name)

    def static_names(self, node):
        return ("name",)

    def static_values(self, node):
        return {"name": node.name}

    def with_static(self, node, name, value):
        return Rows(node.data, value)

    def items(self, node, hidden):
        return [("", f"[{i}]", row) for i, row in enumerate(node.data)]

    def type_name(self, node):
        return f"Rows[{node.name}]"


_structure.register_kind(Rows, RowsKind())


class Veiled:
    """A value hidden from JAX in a node without children (like a frozen value)."""

    def __init__(self, value):
        self.value = value

    def __repr__(self):
        return tc.tree_repr(self)

    def __treescope_repr__(self, path, subtree_renderer):
        return wrapper_treescope_repr(self, path, subtree_renderer)


jax.tree_util.register_pytree_node(Veiled, lambda v: ((), v), lambda v, _: v)


class VeiledKind(_structure.NodeKind):
    wrapper = _structure.Wrapper(
        "~", lambda v: v.value, "a veiled value", "frozen", "Veiled", lambda x: Veiled(x)
    )


_structure.register_kind(Veiled, VeiledKind())


class Holder(tc.TreeClass):
    rows: Rows
    secret: Veiled
    bias: jax.Array


def _holder():
    return Holder(Rows(jnp.arange(6.0).reshape(3, 2), "q"), Veiled(jnp.ones(2)), jnp.zeros(2))


def test_a_new_kind_prints_through_its_row_in_every_printer():
    import treescope

    model = _holder()
    text = repr(model)
    assert "rows=Rows[q]<" in text and "secret=~f32[2]" in text
    assert "Rows[q]<[0. 1.], [2. 3.], [4. 5.]>" in str(model)
    assert "[0]=" in tc.tree_diagram(model) and "secret=~f32[2]" in tc.tree_diagram(model)
    summary = tc.tree_summary(model)
    assert ".rows.data" in summary and ".secret" in summary and "frozen" in summary
    assert "Rows[q]" in tc.tree_graph(model) and "Rows[q]" in tc.tree_mermaid(model)
    assert "Rows[q]" in tree_html(model)
    rendered = treescope.render_to_text({"v": Veiled(2)})
    assert rendered == "{'v': ~2}"


def test_a_new_kind_is_walked_by_every_at_operation():
    model = _holder()
    rows = model.rows.data
    # one child by index (the fast path), and through the general walk
    got = model.at["rows"][1].get()  # fill values that are no rows: the rows, as a tuple
    assert got.rows[0] is None and got.rows[1].tolist() == [2.0, 3.0]
    filled = model.at["rows"][1].get(fill_value=jnp.zeros(2))
    assert filled.rows.data.tolist() == [[0, 0], [2, 3], [0, 0]]
    assert model.at["rows"][-1].set(9.0).rows.data[2].tolist() == [9.0, 9.0]
    assert model.at["rows"][0:2].apply(lambda r: -r).rows.data.tolist() == [
        [-0.0, -1.0],
        [-2.0, -3.0],
        [4.0, 5.0],
    ]
    assert model.at["rows"][...].reduce(lambda a, b: a + b.sum(), initializer=0.0) == 15.0
    _, total = model.at["rows"][...].scan(lambda r, s: (r, s + r.sum()), state=0.0)
    assert total == 15.0
    assert len(model.at["rows"][...].pluck()) == 3
    # an element mask, a class selector, a predicate, a glob
    masked = model.at["rows"][1][jnp.array([True, False])].set(7.0)
    assert masked.rows.data[1].tolist() == [7.0, 3.0]
    assert model.at[tc.glob("rows.[2]")].get().rows[2].tolist() == [4.0, 5.0]
    picked = model.at[tc.where(lambda path, x: path[-1] == SequenceKey(0))].apply(lambda r: r + 1)
    assert picked.rows.data[0].tolist() == [1.0, 2.0]
    # a frozen-like value: selected whole with `is_leaf`, looked into by a class selector
    assert (
        model.at[Veiled].apply(lambda v: Veiled(2), is_leaf=_structure.is_wrapper).secret.value == 2
    )
    zeroed = model.at[jax.Array].apply(jnp.zeros_like)  # the rows, one by one, and the bias
    assert float(zeroed.rows.data.sum()) == 0.0 and float(zeroed.secret.value.sum()) == 2.0
    # a static part set by name, last in the selection
    assert model.at["rows"]["name"].set("k").rows.name == "k"
    # a replacement the kind refuses names the key path
    with pytest.raises(ValueError, match=r"Holder\.rows\[1\]: a row of shape \(2,\)"):
        model.at["rows"][1].set(jnp.ones(3))
    # a missing index names the kind's children
    with pytest.raises(IndexError, match="Rows of length 3"):
        model.at["rows"][5].get()
    assert model.rows.data is rows  # nothing changed in place


def test_a_new_kind_runs_methods_on_a_copy():
    model = _holder()
    value, new = model.at["rows"]["grow"](1.0)
    assert value == 1.0 and new.rows.data[0].tolist() == [1.0, 2.0]
    assert model.rows.data[0].tolist() == [0.0, 1.0]


def test_a_new_kind_has_roles_and_masks():
    model = _holder()
    assert jax.tree_util.tree_leaves(tc.roles(model)) == ["trainable", "frozen", "trainable"]
    mask = jax.tree_util.tree_map(lambda _: True, model)
    assert tc.tree_unmask(tc.tree_mask(model, mask)).rows.data.shape == (3, 2)
    # a selection is a value: its mask has the model's structure, one flag per row here
    mask = model.at["rows"][0].mask()
    assert mask.rows.data.tolist() == [True, False, False] and mask.bias is False
    assert model.at["rows"][0].paths() == [(GetAttrKey("rows"), GetAttrKey("data"))]
    assert tc.at(model)[mask].get().rows[0].tolist() == [0.0, 1.0]
    # an optax mask says yes or no per leaf: one row of a leaf is refused, all rows are not
    with pytest.raises(ValueError, match=r"part of the leaf at Holder\.rows\.data"):
        tc.optim.mask(model.at["rows"][0])
    assert tc.optim.mask(model.at["rows"][...]).rows.data is True


def test_a_new_kind_round_trips_through_checkpoints(tmp_path):
    # the row's static part and the wrapped value are saved, and restored or checked
    model = _holder()
    path = str(tmp_path / "holder.safetensors")
    tc.save(path, model)
    like = Holder(Rows(jnp.zeros((3, 2)), "q"), Veiled(jnp.zeros(2)), jnp.ones(2))
    loaded = tc.load(path, like)
    assert loaded.rows.name == "q" and loaded.rows.data.tolist() == model.rows.data.tolist()
    assert type(loaded.secret) is Veiled and loaded.secret.value.tolist() == [1.0, 1.0]
    assert loaded.bias.tolist() == [0.0, 0.0]
    state = tc.state_dict(model)
    assert sorted(state) == ["bias", "rows", "secret"] and sorted(state["rows"]) == ["data"]
    restored = tc.from_state_dict(like, state)
    assert restored.secret.value.tolist() == [1.0, 1.0] and restored.rows.name == "q"


def test_a_new_kind_of_stack_loads_per_layer_names_through_rules(tmp_path):
    # a file of the unrolled layout (one tensor per row) fills the kind's one array
    path = str(tmp_path / "rows.safetensors")
    tc.save(path, {f"r{i}": jnp.full(2, float(i)) for i in range(3)})
    like = Holder(Rows(jnp.zeros((3, 2)), "q"), Veiled(jnp.zeros(2)), jnp.zeros(2))
    loaded, _ = tc.load(path, like, rules=[("r{i}", "rows[{i}].data")], strict=False)
    assert loaded.rows.data.tolist() == [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]
    # a layer the kind does not have names the layer and the fix
    tc.save(path, {f"r{i}": jnp.full(2, float(i)) for i in range(4)})
    with pytest.raises(ValueError, match=r"layer 3 beyond the 3 of the stack at 'rows'"):
        tc.load(path, like, rules=[("r{i}", "rows[{i}].data")], missing="keep")


def test_a_new_kind_that_differs_from_the_file_names_the_key_path(tmp_path):
    path = str(tmp_path / "holder.safetensors")
    tc.save(path, Holder(Rows(jnp.ones((3, 2)), "q"), Veiled("tanh"), jnp.zeros(2)))
    renamed = Holder(Rows(jnp.ones((3, 2)), "k"), Veiled("tanh"), jnp.zeros(2))
    with pytest.raises(ValueError, match=r"static +Holder\.rows\.name: 'k' \(a `str`\)"):
        tc.load(path, renamed)
    veiled = tc.load(path, Holder(Rows(jnp.ones((3, 2)), "q"), Veiled("relu"), jnp.zeros(2)))
    assert veiled.secret.value == "tanh"  # a wrapped string is data, as a frozen one is
    with pytest.raises(ValueError, match=r"Holder\.secret: an array f32\[2\] in the template"):
        tc.load(path, Holder(Rows(jnp.ones((3, 2)), "q"), Veiled(jnp.ones(2)), jnp.zeros(2)))


class Sealed:
    """A wrapper kind whose row cannot wrap a new value (`Wrapper.wrap` is None)."""

    def __init__(self, value):
        self.value = value


jax.tree_util.register_pytree_node(Sealed, lambda v: ((), v), lambda v, _: v)


class SealedKind(_structure.NodeKind):
    wrapper = _structure.Wrapper("!", lambda v: v.value, "a sealed value", "frozen", "Sealed")


_structure.register_kind(Sealed, SealedKind())


def test_a_wrapper_kind_that_cannot_wrap_again_refuses_a_load_and_a_fill(tmp_path):
    path = str(tmp_path / "sealed.safetensors")
    tc.save(path, {"s": Sealed(jnp.ones(2))})
    like = {"s": Sealed(jnp.zeros(2))}
    with pytest.raises(TypeError, match=r"cannot restore a sealed value \(a `Sealed`\)"):
        tc.load(path, like)
    with pytest.raises(TypeError, match=r"tree\['s'\].*inside a sealed value"):
        tc.at(like)["s"].set(1.0, is_leaf=_structure.is_wrapper)
    assert like["s"].value.tolist() == [0.0, 0.0]
