"""Every tool over every kind of node: the table of node kinds, as its rows promise.

Two kinds are defined here, in a test file, with no change to the package: `Tagged`, a
wrapper carrying per-instance data (a tag) and a role, and `Rows`, a stack of the rows
of one array with its own length and a static name. Each is a class, its JAX
registration and one row (`register_kind`). They and the built-in kinds go through one
test of the printers, `.at`, method calls, roles, masks, checkpoints, sharding rules,
`tc.optim` and `unstack_all`; per-instance data (a tag, a name) survives every round trip.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import AbstractMesh
from jax.tree_util import GetAttrKey, SequenceKey

import treeclass as tc
from treeclass import _structure
from treeclass._pprint_html import Printed

pytestmark = pytest.mark.usefixtures("strict_jax")


# -- two kinds of node the package has never seen ----------------------------------------------


class Tagged:
    """A value hidden from JAX in a node without children, with a tag of its own."""

    def __init__(self, value, tag="default"):
        self.value = value
        self.tag = tag

    def __eq__(self, other):
        return (
            type(other) is Tagged
            and self.tag == other.tag
            and tc.is_tree_equal(self.value, other.value)
        )

    def __hash__(self):
        return hash(self.tag)

    def __repr__(self):
        return tc.tree_repr(self)


jax.tree_util.register_pytree_node(Tagged, lambda t: ((), t), lambda t, _: t)


class TaggedKind(_structure.NodeKind):
    wrapper = _structure.Wrapper(
        "~", lambda t: t.value, "a tagged value", "frozen", "Tagged", lambda t, v: Tagged(v, t.tag)
    )


_structure.register_kind(Tagged, TaggedKind())


class Rows(Printed):
    """The rows of one array, with a static name; JAX sees one leaf, `.data`."""

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


def _row(data, i):
    if isinstance(data, jax.ShapeDtypeStruct):  # an abstract model (`jax.eval_shape`)
        return jax.ShapeDtypeStruct(data.shape[1:], data.dtype)
    return data[i]


class RowsKind(_structure.NodeKind):
    brackets = ("<", ">")
    stack = _structure.Stack(
        length=lambda rows: len(rows.data),
        unstack=lambda rows: tuple(rows.data),
        restack=lambda rows, blocks: Rows(jnp.stack(blocks), rows.name),
    )

    def open(self, node):
        n = len(node.data)
        entries = tuple(SequenceKey(i) for i in range(n))
        return _structure.Opened(entries, [_row(node.data, i) for i in range(n)], None)

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


# -- built-in kinds ----------------------------------------------------------------------------


class Pair(tc.TreeClass):
    w: jax.Array
    b: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Plain:
    w: jax.Array
    b: jax.Array


Point = collections.namedtuple("Point", ["w", "b"])


class Holder(tc.TreeClass):
    k: Any
    bias: jax.Array

    def bump(self):
        self.bias = self.bias + 1.0
        return "bumped"


class Case(NamedTuple):
    make: Any  # a float -> the node, its arrays filled from it
    shows: str | tuple[str, ...]  # in repr and str, and the diagram (the last)
    row: str  # in the summary
    key: str | int | None  # a child `.at` finds directly; None: a wrapper
    roles: set[str]  # of the node's leaves (wrapped values count as one)
    length: int | None = None  # a stack's blocks


TRAIN = {"trainable"}


def _periodic(x):
    layers = [Pair(jnp.full(2, x), jnp.full(2, x)), Point(jnp.full(2, x), jnp.full(2, x))] * 2
    return tc.Periodic.from_layers(layers, 2)


CASES = {
    "tagged": Case(lambda x: Tagged(jnp.full(2, x), "mine"), "k=~", "~f32[2]", None, {"frozen"}),
    "rows": Case(lambda x: Rows(jnp.full((3, 2), x), "q"), "Rows[q]", ".k.data", 1, TRAIN, 3),
    "frozen": Case(lambda x: tc.freeze(jnp.full(2, x)), "k=#", "#f32[2]", None, {"frozen"}),
    "stacked": Case(
        lambda x: tc.Stacked({"w": jnp.full((4, 2), x)}), "Stacked[4×dict]", "4×f32", 1, TRAIN, 4
    ),
    "periodic": Case(_periodic, "Periodic[2×(Pair, Point)]", "2×f32", 3, TRAIN, 4),
    "treeclass": Case(lambda x: Pair(jnp.full(2, x), jnp.full(2, x)), "Pair", ".k.w", "w", TRAIN),
    "dataclass": Case(lambda x: Plain(jnp.full(2, x), jnp.full(2, x)), "Plain", ".k.w", "w", TRAIN),
    "namedtuple": Case(lambda x: Point(jnp.full(2, x), jnp.full(2, x)), "Point", ".k.b", 1, TRAIN),
    "dict": Case(
        lambda x: {"w": jnp.full(2, x), "b": [jnp.full(2, x)]}, "'w'", ".k['b'][0]", "b", TRAIN
    ),
    "list": Case(
        lambda x: [jnp.full(2, x), (jnp.full(2, x),)], ("k=[", ".k:list"), ".k[1][0]", 0, TRAIN
    ),
}


def _leaves(tree):
    return jax.tree_util.tree_leaves(tree)


def _same(a, b):
    return tc.is_tree_equal(a, b) is True


@pytest.mark.parametrize("case", CASES.values(), ids=list(CASES))
def test_every_tool_works_on_every_kind_and_keeps_its_per_instance_data(case, tmp_path):
    node = case.make(1.0)
    tree = Holder(node, jnp.zeros(2))
    structure = jax.tree_util.tree_structure(tree)
    wrapped = tc.is_masked(node)

    # printers: every one shows the kind its own way
    shows = (case.shows,) if type(case.shows) is str else case.shows
    for text in (repr(tree), str(tree)):
        assert shows[0] in text, text
    assert shows[-1] in tc.tree_diagram(tree)
    assert case.row in tc.tree_summary(tree)

    # `.at`: whole-tree operations keep the structure (a stack's length, a name, a tag)
    assert _same(tree.at[...].get(), tree)
    zeroed = tree.at[...].set(0.0)
    assert jax.tree_util.tree_structure(zeroed) == structure
    assert all(float(jnp.abs(x).sum()) == 0.0 for x in _leaves(zeroed))
    plus = tree.at[...].apply(lambda x: x + 1.0)
    assert [float(x.sum()) for x in _leaves(plus)] == [
        float(x.sum()) + x.size for x in _leaves(tree)
    ]
    _, count = tree.at[...].scan(lambda x, n: (x, n + 1), state=0)
    assert count == len(_leaves(tree))
    mask = tree.at["k"].mask(is_leaf=tc.is_masked)
    assert jax.tree_util.tree_structure(mask, is_leaf=tc.is_masked) == jax.tree_util.tree_structure(
        tree, is_leaf=tc.is_masked
    )
    in_k = jax.tree_util.tree_leaves(node, is_leaf=tc.is_masked)
    assert len(tree.at["k"].paths(is_leaf=tc.is_masked)) == len(in_k)
    if case.key is not None:  # one child, found directly, edited and put back
        got = tree.at["k"][case.key].get()
        assert _leaves(got) and len(_leaves(got)) < len(_leaves(tree))
        edited = tree.at["k"][case.key].apply(lambda x: x * 0.0)
        assert jax.tree_util.tree_structure(edited) == structure
        assert sum(float(x.sum()) for x in _leaves(edited)) < sum(
            float(x.sum()) for x in _leaves(tree)
        )
    if wrapped:  # a number put at a wrapped array fills it inside a wrapper like the old one
        filled = tree.at["k"].set(5.0, is_leaf=tc.is_masked)
        assert _same(filled.k, case.make(5.0))
    value, bumped = tree.at["bump"]()
    assert value == "bumped" and _same(bumped.k, node) and float(bumped.bias.sum()) == 2.0

    # roles, and masks: a wrapper kind is masked, unmasking gives its value
    roles = jax.tree_util.tree_leaves(tc.roles(tree))
    assert set(roles[:-1]) == case.roles and roles[-1] == "trainable"
    assert tc.is_masked(tree.k) is (case.key is None)
    if wrapped:
        assert _same(tc.tree_unmask(node), jnp.full(2, 1.0))
    masked = tc.tree_mask(tree, cond=lambda _: True)
    assert not _leaves(masked)
    assert _same(tc.tree_unmask(masked), tc.tree_unmask(tree))

    # checkpoints: into a template with other values, the template's own data kept
    path = str(tmp_path / "model.safetensors")
    tc.save(path, tree)
    template = Holder(case.make(0.0), jnp.ones(2))
    assert _same(tc.load(path, template), tree)
    assert _same(tc.from_state_dict(template, tc.state_dict(tree)), tree)

    # sharding rules, checked on an abstract model: a stack's leaves get `block_axis`
    rules = tc.ShardingRules([], unmatched="replicate", block_axis="pipe")
    specs = rules.specs(jax.eval_shape(lambda: tree), AbstractMesh((1,), ("pipe",)))
    blocked = [len(s) > 0 and s[0] == "pipe" for s in _leaves(specs)]
    assert blocked == [case.length is not None] * len(_leaves(node)) + [False]

    # tc.optim: every trainable leaf moves, a wrapped value stays as it was
    opt = tc.optim.trainable(optax.sgd(1.0), tree)
    grads = jax.tree_util.tree_map(jnp.ones_like, tree)
    updates, _ = opt.update(grads, opt.init(tree), tree)
    stepped = tc.optim.apply_updates(tree, updates)
    assert jax.tree_util.tree_structure(stepped) == structure
    assert [float(x.sum()) for x in _leaves(stepped)] == [
        float(x.sum()) - x.size for x in _leaves(tree)
    ]

    # unstack_all: a stack becomes its blocks, and comes back as it was
    flat = tc.unstack_all(tree)
    if case.length is None:
        assert _same(flat, tree)
    else:
        assert type(flat.k) is tuple and len(flat.k) == case.length
        assert _same(tc.restack(flat, tree), tree)
    assert _same(tree.k, case.make(1.0))  # nothing changed in place


# -- what only some kinds do, through the same rows ---------------------------------------------


def _holder():
    return Holder(
        {"rows": Rows(jnp.arange(6.0).reshape(3, 2), "q"), "tag": Tagged(jnp.ones(2), "mine")},
        jnp.zeros(2),
    )


def test_new_kinds_show_in_the_graph_pictures_html_and_treescope():
    import treescope

    from treeclass._pprint_html import tree_html

    model = _holder()
    assert "Rows[q]" in tc.tree_graph(model) and "Rows[q]" in tc.tree_mermaid(model)
    assert "Rows[q]" in tree_html(model)
    assert treescope.render_to_text({"v": Tagged(2)}) == "{'v': ~2}"


def test_a_new_kind_of_stack_is_walked_by_its_rows_and_edits_name_the_row():
    model = _holder()
    at = model.at["k"]["rows"]
    got = at[1].get()  # fill values that are no rows: the rows, as a tuple
    assert got.k["rows"][0] is None and got.k["rows"][1].tolist() == [2.0, 3.0]
    assert at[1].get(fill_value=jnp.zeros(2)).k["rows"].data.tolist() == [[0, 0], [2, 3], [0, 0]]
    assert at[-1].set(9.0).k["rows"].data[2].tolist() == [9.0, 9.0]
    assert at[1][jnp.array([True, False])].set(7.0).k["rows"].data[1].tolist() == [7.0, 3.0]
    assert model.at[tc.glob("k.rows.[2]")].get().k["rows"][2].tolist() == [4.0, 5.0]
    picked = model.at[tc.where(lambda path, x: path[-1] == SequenceKey(0))].apply(lambda r: r + 1)
    assert picked.k["rows"].data[0].tolist() == [1.0, 2.0]
    assert at["name"].set("k").k["rows"].name == "k"  # a static part, named last
    value, grown = at["grow"](1.0)
    assert value == 1.0 and grown.k["rows"].data[0].tolist() == [1.0, 2.0]
    with pytest.raises(ValueError, match=r"Holder\.k\['rows'\]\[1\]: a row of shape \(2,\)"):
        at[1].set(jnp.ones(3))
    with pytest.raises(IndexError, match="Rows of length 3"):
        at[5].get()
    # an optax mask says yes or no per leaf: one row of a leaf is refused, all rows are not
    with pytest.raises(ValueError, match=r"part of the leaf at Holder\.k\['rows'\]\.data"):
        tc.optim.mask(at[0])
    assert tc.optim.mask(at[...]).k["rows"].data is True
    assert model.k["rows"].data[0].tolist() == [0.0, 1.0]  # nothing changed in place


def test_a_wrapper_kind_is_selected_whole_and_named_by_its_role():
    model = _holder()
    swapped = model.at[Tagged].apply(lambda t: Tagged(2, t.tag), is_leaf=tc.is_masked)
    assert swapped.k["tag"] == Tagged(2, "mine")
    with pytest.raises(
        LookupError, match=r"(?s)reaches Holder\.k\['tag'\] \(frozen\).*tc\.is_masked"
    ):
        model.at["k"]["tag"].set(0.0)
    assert tc.tree_unmask(model).k["tag"].tolist() == [1.0, 1.0]


def test_a_new_kind_of_stack_loads_per_layer_names_through_rules(tmp_path):
    # a file of the unrolled layout (one tensor per row) fills the kind's one array
    path = str(tmp_path / "rows.safetensors")
    tc.save(path, {f"r{i}": jnp.full(2, float(i)) for i in range(3)})
    like = {"rows": Rows(jnp.zeros((3, 2)), "q")}
    loaded, _ = tc.load(path, like, rules=[("r{i}", "rows[{i}].data")], strict=False)
    assert loaded["rows"].data.tolist() == [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]
    # a layer the kind does not have names the layer and the fix
    tc.save(path, {f"r{i}": jnp.full(2, float(i)) for i in range(4)})
    with pytest.raises(ValueError, match=r"layer 3 beyond the 3 of the stack at 'rows'"):
        tc.load(path, like, rules=[("r{i}", "rows[{i}].data")], missing="keep")


def test_a_new_kind_that_differs_from_the_file_names_the_key_path(tmp_path):
    path = str(tmp_path / "holder.safetensors")
    tc.save(path, {"rows": Rows(jnp.ones((3, 2)), "q"), "tag": Tagged("tanh")})
    with pytest.raises(ValueError, match=r"static +tree\['rows'\]\.name: 'k' \(a `str`\)"):
        tc.load(path, {"rows": Rows(jnp.ones((3, 2)), "k"), "tag": Tagged("tanh")})
    loaded = tc.load(path, {"rows": Rows(jnp.ones((3, 2)), "q"), "tag": Tagged("relu", "t")})
    assert loaded["tag"] == Tagged("tanh", "t")  # a wrapped string is data, as a frozen one is
    with pytest.raises(ValueError, match=r"tree\['tag'\]: an array f32\[2\] in the template"):
        tc.load(path, {"rows": Rows(jnp.ones((3, 2)), "q"), "tag": Tagged(jnp.ones(2))})


class Sealed:
    """A wrapper kind whose row cannot wrap a new value (`Wrapper.rewrap` is None)."""

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
        tc.at(like)["s"].set(1.0, is_leaf=tc.is_masked)
    assert like["s"].value.tolist() == [0.0, 0.0]


@settings(max_examples=10, deadline=None)
@given(n=st.integers(1, 5), tag=st.text(max_size=4))
def test_unstack_then_restack_and_rewrap_keep_every_stack_and_tag(n, tag):
    tree = {
        "rows": Rows(jnp.arange(2.0 * n).reshape(n, 2), tag),
        "stacked": tc.Stacked({"w": jnp.arange(float(n))}),
        "tag": Tagged(jnp.ones(2), tag),
    }
    flat = tc.unstack_all(tree)
    assert len(flat["rows"]) == len(flat["stacked"]) == n
    assert _same(tc.restack(flat, tree), tree)
    assert tc.at(tree)["tag"].set(3.0, is_leaf=tc.is_masked)["tag"] == Tagged(jnp.full(2, 3.0), tag)


# -- a wrapper kind inside a stack and a `Sequential`, as a frozen value is ---------------------


WRAPS = {
    "frozen": (tc.freeze, tc.unfreeze),
    "tagged": (lambda v: Tagged(v, "mine"), lambda t: t.value),
}


def _tag(x):
    return getattr(x, "tag", None)  # a frozen value has none: `None` on both sides


@pytest.mark.parametrize("name", list(WRAPS))
def test_a_wrapper_kind_in_a_stack_is_sliced_and_rewrapped_with_its_data(name):
    wrap, unwrap = WRAPS[name]
    template = wrap(jnp.zeros(2))
    stack = tc.Stacked({"w": wrap(jnp.arange(6.0).reshape(3, 2)), "b": jnp.zeros((3, 2))})
    assert jax.tree_util.tree_leaves(stack) == [stack.tree["b"]]  # the wrapped array is hidden

    block = stack[1]
    assert type(block["w"]) is type(template) and _tag(block["w"]) == _tag(template)
    assert unwrap(block["w"]).tolist() == [2.0, 3.0]

    written = tc.at(stack)[1]["w"].set(7.0, is_leaf=tc.is_masked)
    assert type(written.tree["w"]) is type(template) and _tag(written.tree["w"]) == _tag(template)
    assert unwrap(written.tree["w"]).tolist() == [[0.0, 1.0], [7.0, 7.0], [4.0, 5.0]]
    assert unwrap(stack.tree["w"]).tolist() == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]  # unchanged

    blocks = tc.unstack_all(stack)
    assert [_tag(b["w"]) for b in blocks] == [_tag(template)] * 3
    assert [unwrap(b["w"]).tolist() for b in blocks] == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
    again = tc.Stacked.from_blocks(blocks)
    assert type(again.tree["w"]) is type(template) and _tag(again.tree["w"]) == _tag(template)
    assert unwrap(again.tree["w"]).tolist() == unwrap(stack.tree["w"]).tolist()
    assert tc.is_tree_equal(tc.restack(blocks, stack), stack)

    seen = []

    def step(block, total):
        seen.append((type(block["w"]), _tag(block["w"])))
        return total + unwrap(block["w"]).sum(), None

    total, _ = stack.scan(step, jnp.float32(0.0))
    assert float(total) == 15.0 and set(seen) == {(type(template), _tag(template))}

    mixed = [{"w": wrap(jnp.ones(2))}, {"w": jnp.ones(2)}]
    with pytest.raises(ValueError, match=r"frozen in block 0 but not in block 1"):
        tc.Stacked.from_blocks(mixed)


def test_a_wrapper_kind_in_a_sequential_is_kept_and_called_unwrapped():
    linear = tc.nn.Linear(3, 2, key=jax.random.key(0))
    model = tc.nn.Sequential(linear, Tagged(jax.nn.relu, "act"))
    assert model.layers[1] == Tagged(jax.nn.relu, "act")  # kept as given, not frozen again
    assert model[1] is jax.nn.relu and list(model)[1] is jax.nn.relu
    x = jnp.arange(3.0) - 1.0
    assert model(x).tolist() == jax.nn.relu(linear(x)).tolist()
    assert jax.tree_util.tree_leaves(model) == jax.tree_util.tree_leaves(linear)
