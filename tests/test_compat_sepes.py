"""sepes code runs unchanged: sepes's spellings of indexing, calls, masks and backends.

Every test is written the way sepes users write code, with `import treeclass as sp` in
place of `import sepes as sp` (`sp.at(tree, where=...)`, `sp.value_and_tree`,
`sp.at.def_rule`, `sp.tree_mask.def_type`, `sp.bcmap(..., broadcast_to=1)`), so a failure
means a sepes program would break. The tests are our own, not sepes's. Deliberate
differences from sepes are listed in docs/migrating.md, not tested here.
"""

from __future__ import annotations

import dataclasses as dc
import functools as ft
import re
from typing import NamedTuple

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import pytest

import treeclass as sp

# -- at(tree, where=...) -----------------------------------------------------------------------


def test_at_where_keyword_is_the_chained_selection():
    tree = {"a": 1, "b": {"c": 2, "d": 3}}
    assert sp.at(tree, where=["b", "c"]).get() == sp.at(tree)["b"]["c"].get()
    assert sp.at(tree, where=("b", "c")).set(20) == {"a": 1, "b": {"c": 20, "d": 3}}


def test_at_where_positional_takes_masks_and_unions():
    tree = {"a": 1, "b": [2, 3]}
    mask = {"a": False, "b": [True, False]}
    assert sp.at(tree, [mask]).apply(lambda x: -x) == {"a": 1, "b": [-2, 3]}
    assert sp.at(tree, where=[("a", "b")]).get() == tree


def test_at_where_can_be_indexed_further():
    tree = {"a": [1, 2], "b": 3}
    assert sp.at(tree, where=["a"])[1].set(0) == {"a": [1, 0], "b": 3}


def test_at_where_none_selects_the_whole_tree():
    assert sp.at([1, 2], where=None).apply(lambda x: x * 10) == [10, 20]


class _Layer(sp.TreeClass):
    def __init__(self, scale):
        self.weight = jnp.full(2, scale)
        self.bias = jnp.zeros(1)


class _Net(sp.TreeClass):
    def __init__(self):
        self.layers = [_Layer(1.0), _Layer(-2.0), _Layer(3.0)]
        self.steps = jnp.array(0)


class _Odd(sp.BaseKey):
    def __eq__(self, entry):
        return isinstance(entry, jtu.SequenceKey) and entry.idx % 2 == 1


class _Field(NamedTuple):
    name: str


sp.at.def_rule(_Field, lambda matcher, key, child: getattr(key, "name", None) == matcher.name)


@pytest.mark.parametrize(
    "where",
    [
        ["layers", 0, "weight"],
        ["layers", -1, "bias"],
        ["layers", slice(1, None), "weight"],
        ["layers", ..., "bias"],
        [re.compile("lay.*"), 1],
        [_Layer, "weight"],
        [sp.where(lambda path, node: isinstance(node, _Layer) and node.weight[0] > 0)],
        [sp.glob("layers.*.weight")],
        ["layers", _Odd()],
        [_Field("steps")],
        [jtu.GetAttrKey("layers"), jtu.SequenceKey(2)],
        [("steps", "layers"), ...],
        [jax.tree_util.tree_map(lambda x: x.sum() < 0, _Net())],
        ["layers", 1, jax.tree_util.tree_map(lambda x: x > 0, _Layer(1.0))],
    ],
    ids=lambda where: type(where[0]).__name__,
)
def test_at_where_takes_every_selector_kind_as_the_chain_does(where):
    net = _Net()
    chained = sp.at(net)
    for selector in where:
        chained = chained[selector]
    assert sp.is_tree_equal(sp.at(net, where=where).get(), chained.get())
    assert sp.is_tree_equal(sp.at(net, where=where).set(7.0), chained.set(7.0))
    assert not sp.is_tree_equal(chained.set(7.0), net)  # the selection is not empty
    assert sp.is_tree_equal(
        sp.at(net, where=tuple(where)).apply(jnp.negative), chained.apply(jnp.negative)
    )


def test_at_where_selector_errors_name_the_selection():
    with pytest.raises(LookupError, match=r"'wieght' not found at _Net\.layers\[0\].*'weight'"):
        sp.at(_Net(), where=["layers", 0, "wieght"]).get()
    with pytest.raises(TypeError, match=r"where=\['a', 0\]"):
        sp.at(_Net(), where=_Net())


def test_at_where_must_be_a_sequence_of_levels():
    with pytest.raises(TypeError, match=r"where=\['a', 0\]"):
        sp.at({"ab": 1}, where="ab")


# -- value_and_tree ------------------------------------------------------------------------------


class Counter(sp.TreeClass):
    def __init__(self, count: int):
        self.count = count

    def increment(self, by):
        self.count += by
        return self.count


def test_value_and_tree_runs_a_mutating_method_on_a_copy():
    counter = Counter(0)
    value, new = sp.value_and_tree(lambda c: c.increment(2))(counter)
    assert (value, new.count, counter.count) == (2, 2, 0)
    with pytest.raises(AttributeError):
        new.count = 5  # immutable again


def test_value_and_tree_copies_mutable_containers():
    items = [1, 2, 3]

    def mutating(tree):
        tree[0] += 100
        return tree

    new, returned = sp.value_and_tree(mutating)(items)
    assert items == [1, 2, 3] and new == [101, 2, 3] and returned is new


def test_value_and_tree_with_argnums_returns_a_tuple_of_copies():
    def move(a, b):
        b.append(a.pop())

    _, (a, b) = sp.value_and_tree(move, argnums=(0, 1))([1, 2], [3])
    assert a == [1] and b == [3, 2]
    _, (b_only,) = sp.value_and_tree(move, argnums=[1])([1, 2], [3])
    assert b_only == [3, 2]


def test_value_and_tree_copies_keyword_arguments_too():
    state = {"seen": []}

    def log(x, *, state):
        state["seen"].append(x)
        return len(state["seen"])

    value, x = sp.value_and_tree(log)(7, state=state)
    assert value == 1 and x == 7 and state == {"seen": []}


def test_value_and_tree_on_a_registered_pytree_class():
    @jtu.register_pytree_with_keys_class
    class Plain:
        def __init__(self, count):
            self.count = count

        def tree_flatten_with_keys(self):
            return ((jtu.GetAttrKey("count"), self.count),), None

        @classmethod
        def tree_unflatten(cls, aux, children):
            return cls(*children)

        def bump(self):
            self.count += 1
            return self.count

    plain = Plain(0)
    value, new = sp.value_and_tree(lambda p: p.bump())(plain)
    assert value == 1 and new.count == 1 and plain.count == 0 and new is not plain


def test_value_and_tree_needs_a_callable():
    with pytest.raises(TypeError, match="value_and_tree"):
        sp.value_and_tree(Counter(1).count)


def test_value_and_tree_argnums_out_of_range_is_a_type_error():
    with pytest.raises(TypeError, match=r"positional argument 2, but the call passed 1"):
        sp.value_and_tree(lambda x: x, argnums=2)(1)
    with pytest.raises(TypeError, match="argnums"):
        sp.value_and_tree(lambda x: x, argnums="0")


def test_value_and_tree_leaves_inputs_intact_when_the_function_raises():
    counter = Counter(np.zeros(2))

    def breaks(c):
        c.count[0] = 5.0
        c.extra = 1
        raise RuntimeError("halfway")

    with pytest.raises(RuntimeError, match="halfway"):
        sp.value_and_tree(breaks)(counter)
    assert counter.count.tolist() == [0.0, 0.0] and not hasattr(counter, "extra")


def test_value_and_tree_with_an_int_argnums_returns_that_copy_alone():
    def move(a, b):
        b.append(a.pop())
        return len(b)

    assert sp.value_and_tree(move, argnums=1)([1, 2], [3]) == (2, [3, 2])
    assert sp.value_and_tree(move, argnums=-2)([1, 2], [3]) == (2, [1])


def test_value_and_tree_copies_nested_trees_of_every_kind():
    tree = {"counters": [Counter(0), Counter(np.zeros(2))], "log": [[]]}

    def step(tree, *, seen):
        tree["counters"][0].increment(1)
        tree["counters"][1].count[0] = 9.0
        tree["log"][0].append("stepped")
        seen["calls"].append(1)
        return "done"

    seen = {"calls": []}
    value, new = sp.value_and_tree(step)(tree, seen=seen)
    assert value == "done" and new["log"] == [["stepped"]]
    assert new["counters"][0].count == 1 and new["counters"][1].count.tolist() == [9.0, 0.0]
    assert tree["counters"][0].count == 0 and tree["counters"][1].count.tolist() == [0.0, 0.0]
    assert tree["log"] == [[]] and seen == {"calls": []}


def test_value_and_tree_failure_leaves_nested_and_keyword_trees_unchanged():
    tree = {"counter": Counter(0), "items": [1]}
    seen = {"calls": []}

    def breaks(tree, *, seen):
        tree["counter"].increment(5)
        tree["items"].append(2)
        seen["calls"].append(1)
        raise RuntimeError("halfway")

    for argnums in (0, (0,), ()):
        with pytest.raises(RuntimeError, match="halfway"):
            sp.value_and_tree(breaks, argnums=argnums)(tree, seen=seen)
        assert tree["counter"].count == 0 and tree["items"] == [1] and seen == {"calls": []}


def test_value_and_tree_argnums_must_be_ints():
    for argnums in (True, (0, "1"), 1.0, None):
        with pytest.raises(TypeError, match="argnums"):
            sp.value_and_tree(lambda x: x, argnums=argnums)


def test_method_form_and_function_form_agree():
    counter = Counter(1)
    assert sp.value_and_tree(lambda c: c.increment(3))(counter) == counter.at["increment"](3)


# -- is_masked and backend_context ---------------------------------------------------------------

freeze = ft.partial(sp.tree_mask, cond=lambda _: True)
unfreeze = ft.partial(sp.tree_unmask, cond=lambda _: True)


def test_is_masked_marks_frozen_values_for_is_leaf():
    tree = {"a": freeze(1), "b": 2}
    assert sp.is_masked(tree["a"]) and not sp.is_masked(tree["b"])
    assert sp.at(tree)["a"].apply(unfreeze, is_leaf=sp.is_masked) == {"a": 1, "b": 2}


def test_backend_context_accepts_jax():
    with sp.backend_context("jax"):

        class Tree(sp.TreeClass):
            def __init__(self, a):
                self.a = a

    assert jax.tree_util.tree_leaves(Tree(1)) == [1]


@pytest.mark.parametrize("name", ["optree", "numpy", "torch", "default", "JAX", ""])
def test_backend_context_refuses_every_other_name_naming_it(name):
    with pytest.raises(ValueError, match=rf"JAX-only.*no {name!r} backend"):
        sp.backend_context(name)


def test_backend_context_jax_nests_and_changes_nothing():
    tree = {"a": [1, 2]}
    with sp.backend_context("jax"), sp.backend_context("jax"):
        inside = jax.tree_util.tree_leaves(tree)
    assert inside == jax.tree_util.tree_leaves(tree) == [1, 2]


def test_backend_context_refuses_other_backends_before_the_body_runs():
    ran = []
    with pytest.raises(ValueError, match="treeclass is JAX-only"):
        with sp.backend_context("optree"):
            ran.append(True)
    assert not ran


# -- at.def_rule -------------------------------------------------------------------------------


class NameDtypeShape(NamedTuple):
    name: str
    dtype: object
    shape: tuple


def _compare(matcher, key, leaf) -> bool:
    if not isinstance(leaf, jax.Array):
        return False
    if isinstance(key, jtu.GetAttrKey):
        key = key.name
    elif isinstance(key, jtu.DictKey):
        key = key.key
    return matcher.name == key and matcher.dtype == leaf.dtype and matcher.shape == leaf.shape


sp.at.def_rule(NameDtypeShape, _compare)


def test_def_rule_matcher_selects_by_name_dtype_and_shape():
    tree = dict(weight=jnp.arange(9).reshape(3, 3), bias=jnp.zeros(3))
    matcher = NameDtypeShape("weight", jnp.int32, (3, 3))
    out = sp.at(tree)[matcher].apply(lambda x: (x + x.T) / 2)
    assert out["weight"].tolist() == [[0, 2, 4], [2, 4, 6], [4, 6, 8]]
    assert out["bias"] is tree["bias"]


def test_def_rule_matches_treeclass_attributes():
    class Layer(sp.TreeClass):
        def __init__(self):
            self.weight = jnp.ones((2, 2))
            self.bias = jnp.ones(2)

    out = Layer().at[NameDtypeShape("bias", jnp.float32, (2,))].set(0.0)
    assert out.bias.tolist() == [0.0, 0.0] and out.weight.sum() == 4.0  # a number fills it


def test_def_rule_compare_sees_each_entry_and_child():
    seen = []

    class Probe(NamedTuple):
        tag: str

    def compare(matcher, key, child):
        seen.append((matcher.tag, key, child))
        return key == jtu.SequenceKey(1)

    sp.at.def_rule(Probe, compare, broadcastable=True)
    assert sp.at([10, 20])[Probe("p")].set(0) == [10, 0]
    assert seen == [("p", jtu.SequenceKey(0), 10), ("p", jtu.SequenceKey(1), 20)]


def test_def_rule_broadcastable_changes_nothing():
    class Name(NamedTuple):
        name: str

    def compare(matcher, key, child):
        return getattr(key, "key", None) == matcher.name

    tree = {"a": [1, 2], "b": 3}
    results = []
    for broadcastable in (False, True):
        sp.at.def_rule(Name, compare, broadcastable=broadcastable)
        results.append((sp.at(tree)[Name("a")].set(0), sp.at(tree)[Name("a")].pluck()))
    assert results[0] == results[1] == ({"a": [0, 0], "b": 3}, [[1, 2]])


def test_def_rule_selecting_nothing_is_an_error():
    with pytest.raises(LookupError, match="selects nothing"):
        sp.at({"w": jnp.ones(2)})[NameDtypeShape("b", jnp.float32, (2,))].get()


def test_def_rule_is_also_on_the_indexer_class():
    class Even(NamedTuple):
        pass

    sp.AtIndexer.def_rule(Even, lambda _, key, child: key.idx % 2 == 0)
    assert sp.at([1, 2, 3])[Even()].get() == [1, None, 3]


def test_def_rule_checks_its_arguments():
    class Odd(NamedTuple):
        pass

    with pytest.raises(TypeError, match="broadcastable"):
        sp.at.def_rule(Odd, lambda *_: True, broadcastable=1)
    with pytest.raises(TypeError, match="compare"):
        sp.at.def_rule(Odd, None)
    with pytest.raises(TypeError, match="type"):
        sp.at.def_rule(Odd(), lambda *_: True)


def test_jax_key_entries_are_selectors():
    tree = {"a": [1, 2], "b": 3}
    assert sp.at(tree)[jtu.DictKey("a")][jtu.SequenceKey(0)].set(0) == {"a": [0, 2], "b": 3}


# -- tree_mask.def_type / tree_unmask.def_type ----------------------------------------------------


@dc.dataclass
class MyInt:
    value: int


@dc.dataclass
class MaskedInt:
    value: MyInt


@sp.tree_mask.def_type(MyInt)
def _mask_int(value):
    return MaskedInt(value)


@sp.tree_unmask.def_type(MaskedInt)
def _unmask_int(value):
    return value.value


def test_custom_mask_and_unmask_rules_round_trip():
    tree = [MyInt(1), MyInt(2), {"a": MyInt(3)}]
    masked = sp.tree_mask(tree, cond=lambda _: True)
    assert masked == [MaskedInt(MyInt(1)), MaskedInt(MyInt(2)), {"a": MaskedInt(MyInt(3))}]
    assert sp.is_masked(masked[0]) is True
    assert sp.tree_unmask(masked) == tree


def test_custom_unmask_predicate_sees_the_unwrapped_value():
    masked = sp.tree_mask([MyInt(1), MyInt(2)], cond=lambda _: True)
    out = sp.tree_unmask(masked, cond=lambda v: v.value == 2)
    assert out == [MaskedInt(MyInt(1)), MyInt(2)]


def test_custom_mask_rule_with_a_mask_tree():
    masked = sp.tree_mask([MyInt(1), 2.0], mask=[True, False])
    assert masked == [MaskedInt(MyInt(1)), 2.0]
    assert sp.tree_unmask(masked, mask=[True, False]) == [MyInt(1), 2.0]


def test_values_without_a_rule_are_still_frozen():
    masked = sp.tree_mask({"n": 1, "w": 1.0})
    assert sp.is_frozen(masked["n"]) and masked["w"] == 1.0


def test_def_type_needs_a_type_and_a_callable():
    with pytest.raises(TypeError, match="expects a type"):
        sp.tree_mask.def_type(MyInt(1))
    with pytest.raises(TypeError, match="callable"):
        sp.tree_unmask.def_type(MyInt)(None)


# -- pluck -------------------------------------------------------------------------------------


def test_pluck_returns_the_selected_subtrees():
    tree = [1, 2, [3, 4]]
    assert sp.at(tree)[2].pluck() == [[3, 4]]
    assert sp.at(tree)[0, 1].pluck(1) == [1]
    assert sp.at(tree)[0, 1].pluck(2) == [1, 2]
    assert sp.at(dict(a=1, b=2))[...].pluck() == [1, 2]


def test_pluck_with_a_mask_takes_the_selected_leaves():
    tree = {"a": 1, "b": [2, 3, 4]}
    assert sp.at(tree)[{"a": True, "b": [False, True, False]}].pluck() == [1, 3]


def test_pluck_with_an_element_mask_takes_the_selected_elements():
    tree = {"x": jnp.arange(4)}
    (picked,) = sp.at(tree)[{"x": tree["x"] > 1}].pluck()
    assert picked.tolist() == [2, 3]


def test_pluck_collects_instances_of_a_class():
    class Leaf(sp.TreeClass):
        def __init__(self, v):
            self.v = v

    tree = {"a": Leaf(1), "b": [Leaf(2), 3]}
    assert [leaf.v for leaf in sp.at(tree)[Leaf].pluck()] == [1, 2]


def test_pluck_count_keeps_the_first_subtrees_in_flatten_order():
    tree = [1, 2, [3, 4]]
    assert sp.at(tree)[2, 0].pluck(1) == [1]  # flatten order, not the union's
    assert sp.at(tree)[...].pluck(10) == [1, 2, [3, 4]]
    assert sp.at(tree)[...].pluck(None) == sp.at(tree)[...].pluck()
    assert sp.at(tree)[[False, False, [False, False]]].pluck(0) == []
    assert sp.at(tree)[[False, False, [False, False]]].pluck() == []


def test_pluck_count_refuses_bools_and_floats():
    for count in (True, 1.0, "1"):
        with pytest.raises(TypeError, match=r"pluck.*count"):
            sp.at([1, 2])[...].pluck(count)


def test_pluck_count_must_be_a_non_negative_int():
    assert sp.at([1, 2])[...].pluck(0) == []
    with pytest.raises(TypeError, match="count"):
        sp.at([1, 2])[...].pluck(-1)


# -- bcmap broadcast_to --------------------------------------------------------------------------


def test_bcmap_broadcast_to_a_position():
    def func(x, y):
        return x + y

    assert sp.bcmap(func, broadcast_to=1)(1, [2, 3, 4]) == [3, 4, 5]
    assert sp.bcmap(func, broadcast_to=-1)(1, [2, 3, 4]) == [3, 4, 5]


def test_bcmap_broadcast_to_a_keyword():
    def func(x, y):
        return x + y

    assert sp.bcmap(func, broadcast_to="y")(x=1, y=[2, 3, 4]) == [3, 4, 5]


def test_bcmap_broadcast_to_maps_every_argument_of_that_structure():
    out = sp.bcmap(lambda s, x, y: s * (x + y), broadcast_to=1)(2, [1, 2], [10, 20])
    assert out == [22, 44]


def test_bcmap_broadcast_to_a_missing_argument_is_a_type_error():
    with pytest.raises(TypeError, match="positional argument 3, but the call passed 2"):
        sp.bcmap(lambda x, y: x + y, broadcast_to=3)(1, [2])
    with pytest.raises(TypeError, match=r"keyword argument `y`.*keywords passed: `x`"):
        sp.bcmap(lambda x, y=0: x + y, broadcast_to="y")(x=[1])


def test_bcmap_broadcast_to_a_position_passed_by_keyword_is_a_type_error():
    with pytest.raises(TypeError, match=r"positional argument 1, but the call passed 0"):
        sp.bcmap(lambda x, y: x + y, broadcast_to=1)(x=1, y=[2])
    with pytest.raises(TypeError, match=r"keyword argument `y`.*keywords passed: none"):
        sp.bcmap(lambda x, y: x + y, broadcast_to="y")(1, [2])


def test_bcmap_broadcast_to_position_and_keyword_agree():
    def func(x, y, z=0):
        return x * y + z

    by_position = sp.bcmap(func, broadcast_to=1)(2, [1, 2], z=10)
    by_keyword = sp.bcmap(func, broadcast_to="y")(x=2, y=[1, 2], z=10)
    assert by_position == by_keyword == [12, 14]
    assert sp.bcmap(func, broadcast_to=np.int64(1))(2, [1, 2]) == [2, 4]


def test_bcmap_broadcast_to_a_leaf_argument_is_one_plain_call():
    calls = []

    def func(x, y):
        calls.append((x, y))
        return y

    assert sp.bcmap(func, broadcast_to=1)([1, 2], 3) == 3
    assert calls == [([1, 2], 3)]


# -- tree_mask(cond=...) ---------------------------------------------------------------------------


def test_tree_mask_cond_that_is_not_a_predicate_is_a_type_error():
    with pytest.raises(TypeError, match="must be a predicate"):
        sp.tree_mask({"a": 1}, cond=1.0)


def test_tree_mask_cond_error_is_also_the_value_error_pytreeclass_raises():
    with pytest.raises(ValueError):
        sp.tree_mask({"a": 1}, mask=1.0)
    with pytest.raises(ValueError, match=r"the mask has 1 at `tree\['a'\]`"):
        sp.tree_mask({"a": 1, "b": 2}, mask={"a": 1, "b": True})
