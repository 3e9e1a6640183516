"""Tests for the `.at[...]` indexer (treeclass/_at.py): operations, errors, method calls."""

from __future__ import annotations

import collections
import copy
import re
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import treeclass as tc
from treeclass._at import AtIndexer

# -- helpers -----------------------------------------------------------------------------


class Linear(tc.TreeClass):
    weight: jax.Array
    bias: jax.Array
    name: str = tc.field(default="linear", static=True)

    def scale(self, factor):
        self.weight = self.weight * factor
        return factor

    def rename(self, name):
        self.name = name


class MLP(tc.TreeClass):
    def __init__(self, n: int):
        self.layers = tuple(Linear(jnp.full((2, 2), float(i)), jnp.zeros(2)) for i in range(n))
        self.scale = 1.0

    def grow(self, value):
        self.extra = value  # adding an attribute
        self.layers[0].bias = jnp.full(2, value)  # nested mutation
        return "grown"

    def forget(self):
        del self.scale

    def fail(self):
        self.layers[0].bias = jnp.ones(2)
        raise RuntimeError("boom")


Point = collections.namedtuple("Point", ["x", "y"])


def leaves_equal(a, b) -> bool:
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    pairs = zip(la, lb, strict=True)
    return ta == tb and all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in pairs)


def positive(tree):
    return jax.tree_util.tree_map(lambda x: x > 0, tree)


# -- name and index chains ---------------------------------------------------------------


def test_set_on_name_chain_returns_new_tree_and_keeps_input():
    model = MLP(3)
    new = model.at["layers"][1]["weight"].set(jnp.ones((2, 2)) * 9)
    assert float(new.layers[1].weight[0, 0]) == 9.0
    assert float(model.layers[1].weight[0, 0]) == 1.0


def test_set_on_name_chain_shares_untouched_subtrees():
    model = MLP(3)
    new = model.at["layers"][1]["weight"].set(0.0)
    assert new.layers[0] is model.layers[0] and new.layers[2] is model.layers[2]
    assert new.layers[1].bias is model.layers[1].bias


def test_set_result_is_sealed_and_keeps_static_fields():
    new = MLP(2).at["layers"][0]["bias"].set(jnp.ones(2))
    assert new.layers[0].name == "linear"
    with pytest.raises(AttributeError):
        new.layers[0].bias = 1
    assert jax.tree_util.tree_structure(new) == jax.tree_util.tree_structure(MLP(2))


def test_negative_index_counts_from_the_end():
    model = MLP(3)
    new = model.at["layers"][-1]["bias"].set(jnp.ones(2))
    assert float(new.layers[2].bias[0]) == 1.0


def test_chaining_after_an_operation():
    layer = Linear(jnp.zeros(2), jnp.zeros(2))
    new = layer.at["weight"].set(1.0).at["bias"].set(2.0)
    assert (new.weight.tolist(), new.bias.tolist()) == ([1.0, 1.0], [2.0, 2.0])


def test_at_function_and_indexer_class_on_dict():
    tree = {"a": {"b": 1, "c": [1, 2]}}
    assert tc.at(tree)["a"]["c"][0].set(5) == {"a": {"b": 1, "c": [5, 2]}}
    assert AtIndexer(tree)["a"]["b"].apply(lambda x: x + 1) == {"a": {"b": 2, "c": [1, 2]}}
    assert tree == {"a": {"b": 1, "c": [1, 2]}}


def test_set_on_list_tuple_namedtuple_and_none_holding_trees():
    tree = {"l": [1, (2, 3)], "p": Point(4, 5), "n": None}
    new = tc.at(tree)["l"][1][0].set(20)
    assert new["l"] == [1, (20, 3)] and isinstance(new["l"][1], tuple)
    assert tc.at(tree)["p"]["y"].set(50)["p"] == Point(4, 50)
    assert tc.at(tree)["p"][0].set(40)["p"] == Point(40, 5)
    assert tc.at(tree)[...].set(0) == {"l": [0, (0, 0)], "p": Point(0, 0), "n": None}


def test_set_on_equinox_module():
    class Layer(eqx.Module):
        weight: jax.Array
        tag: str = eqx.field(static=True, default="t")

    layer = Layer(jnp.ones(2))
    new = tc.at(layer)["weight"].set(jnp.zeros(2))
    assert isinstance(new, Layer) and float(new.weight.sum()) == 0.0 and new.tag == "t"
    assert float(layer.weight.sum()) == 2.0


def test_set_on_custom_registered_node_with_flattened_index_keys():
    class Pair:
        def __init__(self, a, b):
            self.a, self.b = a, b

    jax.tree_util.register_pytree_node(Pair, lambda p: ((p.a, p.b), None), lambda _, c: Pair(*c))
    new = tc.at({"p": Pair(1, 2)})["p"][1].set(20)
    assert (new["p"].a, new["p"].b) == (1, 20)


def test_ordered_dict_keeps_its_type_and_order():
    tree = collections.OrderedDict(b=1, a=2)
    new = tc.at(tree)["a"].set(5)
    assert isinstance(new, collections.OrderedDict) and list(new.items()) == [("b", 1), ("a", 5)]


def test_dict_keeps_insertion_order_on_set():
    new = tc.at({"b": 1, "a": 2})["a"].set(3)
    assert list(new) == ["b", "a"]


def test_int_key_of_a_dict():
    assert tc.at({0: "x", 1: "y"})[1].set("z") == {0: "x", 1: "z"}


def test_union_at_one_level():
    tree = {"a": 1, "b": 2, "c": 3}
    assert tc.at(tree)["a", "c"].set(0) == {"a": 0, "b": 2, "c": 0}


def test_ellipsis_selects_every_child_and_alone_the_whole_tree():
    model = MLP(2)
    new = model.at["layers"][...]["bias"].set(1.0)
    assert all(layer.bias.tolist() == [1.0, 1.0] for layer in new.layers)
    assert tc.at(3.0)[...].set(1.0) == 1.0
    assert leaves_equal(model.at[...].get(), model)


def test_no_selector_selects_the_whole_tree():
    assert tc.at({"a": 1}).set(0) == {"a": 0}


def test_regex_selects_matching_names_at_one_level():
    tree = {"w1": 1, "w2": 2, "b": 3, "nested": {"w3": 4}}
    assert tc.at(tree)[re.compile(r"w\d")].set(0) == {"w1": 0, "w2": 0, "b": 3, "nested": {"w3": 4}}


# -- get ---------------------------------------------------------------------------------


def test_get_replaces_unselected_leaves_with_none():
    layer = Linear(jnp.ones(2), jnp.zeros(2))
    got = layer.at["weight"].get()
    assert got.bias is None and got.weight is layer.weight


def test_get_with_fill_value():
    assert tc.at({"a": 1, "b": {"c": 2}})["a"].get(fill_value=0) == {"a": 1, "b": {"c": 0}}


def test_get_with_bool_array_mask_returns_selected_elements():
    tree = {"a": jnp.array([-1.0, 2.0, 3.0]), "b": -4.0}
    got = tc.at(tree)[positive(tree)].get()
    assert got["a"].tolist() == [2.0, 3.0] and got["b"] is None


def test_get_with_bool_array_mask_and_fill_value_keeps_shape():
    tree = {"a": jnp.array([-1.0, 2.0])}
    assert tc.at(tree)[positive(tree)].get(fill_value=0.0)["a"].tolist() == [0.0, 2.0]


# -- set ---------------------------------------------------------------------------------


def test_set_with_bool_array_mask_uses_where_semantics():
    tree = {"a": jnp.array([-1.0, 2.0]), "b": 3.0, "c": -3.0}
    new = tc.at(tree)[positive(tree)].set(0.0)
    assert new["a"].tolist() == [-1.0, 0.0] and new["b"] == 0.0 and new["c"] == -3.0


def test_set_with_value_of_the_selected_subtree_structure():
    model = MLP(2)
    replacement = Linear(jnp.ones((2, 2)), jnp.ones(2))
    new = model.at["layers"][0].set(replacement)
    assert leaves_equal(new.layers[0], replacement)


def test_set_with_prefix_value_broadcasts_to_subtrees():
    tree = {"x": {"a": 1, "b": 2}, "y": {"a": 3}}
    assert tc.at(tree)[...].set({"x": 10, "y": 20}) == {"x": {"a": 10, "b": 10}, "y": {"a": 20}}


def test_set_with_value_of_the_whole_tree_structure_reads_where_selected():
    tree = {"a": 1, "b": 2}
    other = {"a": 10, "b": 20}
    assert tc.at(tree)["b"].set(other) == {"a": 1, "b": 20}


def test_set_value_fitting_neither_selection_nor_tree_is_put_whole():
    # PyTreeClass's rule: one value at every selected position
    assert tc.at({"a": 1, "b": 2})["a"].set({"x": 1}) == {"a": {"x": 1}, "b": 2}
    assert tc.at({"a": 1, "b": 2})["a"].set((7, 8)) == {"a": (7, 8), "b": 2}
    assert tc.at({"a": [1, 2], "b": 3})["a"].set((7, 8, 9)) == {"a": (7, 8, 9), "b": 3}


def test_set_none_replaces_the_leaf():
    assert tc.at({"a": 1})["a"].set(None) == {"a": None}


# -- apply, reduce, scan -----------------------------------------------------------------


def test_apply_with_bool_array_mask():
    tree = {"a": jnp.array([-1.0, 2.0])}
    assert tc.at(tree)[positive(tree)].apply(lambda x: x * 10)["a"].tolist() == [-1.0, 20.0]


def test_apply_may_return_a_tree_in_place_of_a_leaf():
    assert tc.at({"a": 1})["a"].apply(lambda x: {"inner": x}) == {"a": {"inner": 1}}


def test_reduce_over_selection_in_flatten_order():
    tree = {"b": [1, 2], "a": 3}
    seen = tc.at(tree)[...].reduce(lambda acc, x: acc + [x], initializer=[])
    assert seen == jax.tree_util.tree_leaves(tree)


def test_reduce_without_initializer_uses_first_leaf():
    assert tc.at({"a": 1, "b": 2, "c": 3})["b", "c"].reduce(lambda a, b: a * b) == 6


def test_reduce_of_empty_selection_needs_initializer():
    with pytest.raises(TypeError, match=r"tree\.at\[\{'a': False\}\].*initializer"):
        tc.at({"a": 1})[{"a": False}].reduce(lambda a, b: a + b)
    assert tc.at({"a": 1})[{"a": False}].reduce(lambda a, b: a + b, initializer=0) == 0


def test_reduce_with_element_mask_sees_selected_elements():
    tree = {"a": jnp.array([-1.0, 2.0, 3.0])}
    total = tc.at(tree)[positive(tree)].reduce(lambda acc, x: acc + x.sum(), initializer=0.0)
    assert float(total) == 5.0


def test_scan_threads_state_and_returns_new_tree():
    tree = {"a": 1, "b": 2, "c": 3}

    def running_sum(leaf, acc):
        return leaf + acc, acc + leaf

    new, state = tc.at(tree)["a", "c"].scan(running_sum, 0)
    assert new == {"a": 1, "b": 2, "c": 4} and state == 4


def test_scan_with_element_mask_keeps_unselected_elements():
    tree = {"a": jnp.array([-1.0, 2.0])}
    new, count = tc.at(tree)[positive(tree)].scan(lambda x, n: (x * 0, n + 1), 0)
    assert new["a"].tolist() == [-1.0, 0.0] and count == 1


def test_scan_function_not_returning_a_pair_is_named_with_what_it_returned():
    with pytest.raises(TypeError, match=r"at tree\['b'\] it returned 2 \(an `int`\)\."):
        tc.at({"a": 1, "b": 2})["b"].scan(lambda x, n: x, 0)


def test_is_leaf_is_accepted_by_every_operation():
    tree = {"a": (1, 2), "b": 3}
    is_pair = lambda x: isinstance(x, tuple)
    assert tc.at(tree)[...].apply(lambda x: "leaf", is_leaf=is_pair) == {"a": "leaf", "b": "leaf"}
    assert tc.at(tree)["a"].set(0, is_leaf=is_pair) == {"a": 0, "b": 3}
    assert tc.at(tree)["b"].get(is_leaf=is_pair) == {"a": None, "b": 3}
    assert tc.at(tree)[...].reduce(lambda a, x: a + [x], initializer=[], is_leaf=is_pair) == [
        (1, 2),
        3,
    ]
    assert tc.at(tree)["a"].scan(lambda x, s: (s, s + 1), 0, is_leaf=is_pair) == (
        {"a": 0, "b": 3},
        1,
    )


# -- masks with paths --------------------------------------------------------------------


def test_mask_after_path_selector_applies_to_the_node_it_follows():
    tree = {"a": jnp.array([-1.0, 2.0]), "b": jnp.array([5.0])}
    new = tc.at(tree)["a"][tree["a"] > 0].set(0.0)
    assert new["a"].tolist() == [-1.0, 0.0] and new["b"].tolist() == [5.0]
    # a mask of the whole tree does not fit the node it follows: an error, not a guess
    with pytest.raises(ValueError, match=r"does not match the tree at tree\['a'\]"):
        tc.at(tree)["a"][positive(tree)].set(0.0)
    assert tree["a"].tolist() == [-1.0, 2.0]


def test_subtree_mask_after_path_selector():
    tree = {"a": {"x": 1.0, "y": -1.0}, "b": 2.0}
    new = tc.at(tree)["a"][{"x": True, "y": False}].set(0.0)
    assert new == {"a": {"x": 0.0, "y": -1.0}, "b": 2.0}


def test_prefix_mask_selects_whole_subtrees():
    model = MLP(2)
    mask = MLP(2).at["layers"].set(False).at["scale"].set(True)
    assert model.at[mask].get().scale == 1.0
    prefix = {"a": True, "b": False}
    assert tc.at({"a": {"x": 1, "y": 2}, "b": [3]})[prefix].set(0) == {
        "a": {"x": 0, "y": 0},
        "b": [3],
    }


def test_mask_treeclass_selects_where_true():
    model = MLP(2)
    mask = jax.tree_util.tree_map(lambda x: False, model).at["layers"][1]["bias"].set(True)
    new = model.at[mask].set(jnp.ones(2) * 7)
    assert float(new.layers[1].bias[0]) == 7.0 and float(new.layers[0].bias[0]) == 0.0


def test_mask_structure_mismatch_says_where():
    with pytest.raises(ValueError, match=r"does not match the tree at tree\['b'\].*'c'"):
        tc.at({"a": 1, "b": {"c": 2}})[{"a": True, "b": {"d": True}}].get()


def test_mask_with_non_bool_leaf_is_rejected():
    with pytest.raises(NotImplementedError, match="Unsupported selector"):
        tc.at({"a": 1})[{"a": 1}]
    with pytest.raises(ValueError, match=r"mask leaf at tree\['a'\]\['b'\] is 1\.0"):
        tc.at({"a": {"b": 1}})[{"a": {"b": 1.0}}].get()


def test_mask_of_wrong_node_type_is_reported_at_root():
    with pytest.raises(ValueError, match=r"at tree: the tree has a `dict`.*the mask has a `list`"):
        tc.at({"a": 1})[[True]].get()


def test_tuple_of_bools_is_one_mask_for_a_tuple_tree():
    assert tc.at((1, 2))[True, False].set(0) == (0, 2)


# -- classes, predicates, globs, BaseKey --------------------------------------------------


def test_class_selector_reaches_every_instance_then_relative_names():
    model = MLP(3)
    new = model.at[Linear]["weight"].apply(lambda w: w + 100)
    assert [float(layer.weight[0, 0]) for layer in new.layers] == [100.0, 101.0, 102.0]
    assert new.scale == 1.0


def test_class_selector_does_not_descend_into_a_match():
    inner = Linear(jnp.ones(1), jnp.ones(1))
    outer = Linear(inner, jnp.zeros(1))
    seen = tc.at({"o": outer})[Linear].reduce(lambda acc, x: acc + 1, initializer=0)
    assert seen == 3  # all leaves of the outer match, selected once


def test_class_selector_on_leaves():
    tree = {"a": jnp.ones(2), "b": 1.0}
    assert tc.at(tree)[jax.Array].get() == {"a": tree["a"], "b": None}


def test_where_predicate_receives_full_path_and_node():
    model = MLP(2)
    seen = []

    def fn(path, node):
        seen.append(jax.tree_util.keystr(path))
        return path[-1] == jax.tree_util.GetAttrKey("bias")

    new = model.at[tc.where(fn)].set(5.0)
    assert [layer.bias.tolist() for layer in new.layers] == [[5.0, 5.0]] * 2
    assert ".layers[0].bias" in seen


def test_glob_reaches_deep_leaves():
    model = MLP(3)
    new = model.at[tc.glob("layers.*.bias")].set(1.0)
    assert [layer.bias.tolist() for layer in new.layers] == [[1.0, 1.0]] * 3
    assert new.layers[0].weight is model.layers[0].weight


def test_glob_double_star_and_brackets():
    tree = {"enc": {"l0": {"w": 1}, "l1": {"w": 2, "b": 3}}, "w": 4}
    assert tc.at(tree)[tc.glob("**.w")].reduce(lambda a, b: a + b) == 7
    assert tc.at(tree)[tc.glob("enc.**.w")].reduce(lambda a, b: a + b) == 3
    assert tc.at(tree)[tc.glob("['enc'].l1.b")].get(fill_value=0)["enc"]["l1"]["b"] == 3


def test_glob_matches_keystr_of_a_path():
    tree = {"a": [{"b": 1}, {"b": 2}]}
    path = jax.tree_util.tree_flatten_with_path(tree)[0][1][0]
    assert tc.at(tree)[tc.glob(jax.tree_util.keystr(path))].set(0) == {"a": [{"b": 1}, {"b": 0}]}


def test_basekey_subclass_matches_entries():
    class Suffix(tc.BaseKey):
        def __init__(self, suffix):
            self.suffix = suffix

        def __eq__(self, entry):
            return isinstance(entry, jax.tree_util.GetAttrKey) and entry.name.endswith(self.suffix)

    model = MLP(2)
    new = model.at["layers"][...][Suffix("ight")].set(0.0)
    assert [layer.weight.tolist() for layer in new.layers] == [[[0.0] * 2] * 2] * 2


def test_mixed_union_of_name_and_class():
    tree = {"x": 1.0, "m": Linear(jnp.ones(1), jnp.ones(1))}
    new = tc.at(tree)["x", Linear].set(0.0)
    assert new["x"] == 0.0 and new["m"].weight == 0.0


# -- jit, grad, vmap ---------------------------------------------------------------------


def test_set_with_tracer_value_under_jit():
    model = MLP(2)

    @jax.jit
    def fn(m, w):
        return m.at["layers"][1]["weight"].set(w)

    assert float(fn(model, jnp.ones((2, 2)) * 3).layers[1].weight[0, 0]) == 3.0


def test_traced_mask_under_jit():
    tree = {"a": jnp.array([-1.0, 2.0]), "b": jnp.array(-3.0)}

    @jax.jit
    def fn(t):
        return tc.at(t)[positive(t)].apply(lambda x: x * 10), tc.at(t)[positive(t)].get(0.0)

    applied, got = fn(tree)
    assert applied["a"].tolist() == [-1.0, 20.0] and float(applied["b"]) == -3.0
    assert got["a"].tolist() == [0.0, 2.0]


def test_traced_mask_get_without_fill_explains():
    tree = {"a": jnp.array([-1.0, 2.0])}
    with pytest.raises(TypeError, match=r"(?s)leaf\[mask\]` at tree\['a'\].*fill_value"):
        jax.jit(lambda t: tc.at(t)[positive(t)].get())(tree)


def test_grad_through_apply():
    model = MLP(2)

    def loss(m):
        m = m.at[Linear]["weight"].apply(jnp.square)
        return sum(jnp.sum(layer.weight) for layer in m.layers)

    grads = jax.grad(loss)(model)
    assert float(grads.layers[1].weight[0, 0]) == 2.0


def test_vmap_over_set():
    out = jax.vmap(lambda x: tc.at({"x": x, "y": 1.0})["x"].apply(lambda v: v * 2))(jnp.arange(3.0))
    assert out["x"].tolist() == [0.0, 2.0, 4.0]


# -- errors ------------------------------------------------------------------------------


def test_missing_name_names_path_and_closest():
    with pytest.raises(
        LookupError,
        match=r"'weigth' not found at MLP\.layers\[0\]; "
        r"did you mean 'weight'\?",
    ):
        MLP(2).at["layers"][0]["weigth"].set(1.0)


def test_missing_name_in_get_also_raises():
    with pytest.raises(LookupError, match=r"'zz' not found at tree\. Children there: 'a'"):
        tc.at({"a": 1})["zz"].get()


def test_index_out_of_range():
    with pytest.raises(
        IndexError,
        match=r"index 5 out of range at MLP\.layers: a tuple of "
        r"length 2",
    ):
        MLP(2).at["layers"][5].set(0)


def test_index_on_named_node():
    with pytest.raises(IndexError, match=r"index 0 is not a child of MLP"):
        MLP(1).at[0].get()


def test_name_on_leaf():
    with pytest.raises(LookupError, match=r"'x' not found at tree\['a'\]: it is a leaf"):
        tc.at({"a": 1})["a"]["x"].set(0)


def test_get_on_static_field_raises():
    # `set` and `apply` change a static field named last (tests/test_roles.py); reading
    # it through `.at` is refused, naming the field
    with pytest.raises(LookupError, match=r"'name' at MLP\.layers\[0\] is a static field"):
        MLP(1).at["layers"][0]["name"].get()


def test_selection_reaching_only_static_fields_says_so():
    layer = Linear(jnp.ones(1), jnp.ones(1))
    with pytest.raises(
        LookupError, match=r"(?s)reaches no leaves.*Linear\.name \(a static field\)"
    ):
        layer.at[re.compile("na.*")].set("x")


def test_unsupported_selector_lists_supported_kinds():
    with pytest.raises(
        NotImplementedError,
        match=r"(?s)Unsupported selector 1\.5.*MLP\.at\['layers'\]\[1\.5\]"
        r".*Supported: a str name",
    ):
        MLP(1).at["layers"][1.5]


def test_list_selector_suggests_a_tuple():
    with pytest.raises(NotImplementedError, match="use a tuple"):
        tc.at({"a": 1})[["a"]]


def test_basekey_class_instead_of_instance():
    class Key(tc.BaseKey):
        def __eq__(self, entry):
            return True

    with pytest.raises(TypeError, match="select with an instance"):
        tc.at({"a": 1})[Key]


def test_indexer_is_not_iterable():
    with pytest.raises(TypeError, match="cannot be iterated"):
        list(tc.at({"a": 1}))


def test_failed_operation_leaves_input_unchanged():
    tree = {"a": [1, 2], "b": {"c": 3}}
    snapshot = copy.deepcopy(tree)
    for bad in (
        lambda: tc.at(tree)["b"]["zz"].set(0),
        lambda: tc.at(tree)["a"][9].set(0),
        lambda: tc.at(tree)["a"][{"x": True}].set(0),
        lambda: tc.at(tree)[{"a": [True, True], "b": {"d": True}}].set(0),
    ):
        with pytest.raises((LookupError, ValueError)):
            bad()
        assert tree == snapshot


# -- frozen values -----------------------------------------------------------------------


def test_selection_of_only_frozen_values_says_so():
    tree = {"a": tc.freeze(1.0), "b": tc.freeze(2.0)}
    with pytest.raises(LookupError, match=r"(?s)reaches no leaves.*tree\['a'\] \(frozen\)"):
        tc.at(tree)["a"].set(0.0)
    with pytest.raises(LookupError, match=r"tree\['b'\] \(frozen\)"):
        tc.at(tree)[...].apply(lambda x: x)


def test_frozen_values_are_selectable_as_leaves_with_is_leaf():
    tree = {"a": tc.freeze(1.0), "b": 2.0}
    new = tc.at(tree)["a"].apply(lambda f: tc.unfreeze(f) * 10, is_leaf=tc.is_frozen)
    assert new == {"a": 10.0, "b": 2.0}


def _frozen_net() -> dict:
    return {
        "w": tc.freeze(jnp.ones((2, 3))),
        "n": tc.freeze(np.arange(3, dtype=np.int8)),
        "b": jnp.ones(3),
        "lr": tc.freeze(0.5),
    }


_FROZEN_NUMBER_PUTS = {
    "set by name": lambda t: tc.at(t)["w"].set(0.0, is_leaf=tc.is_frozen),
    "set everything": lambda t: tc.at(t)[...].set(0.0, is_leaf=tc.is_frozen),
    "set by mask": lambda t: tc.at(t)[{"w": True, "n": False, "b": False, "lr": False}].set(
        0.0, is_leaf=tc.is_frozen
    ),
    "set by predicate": lambda t: tc.at(t)[tc.where(lambda p, x: np.ndim(x) == 2)].set(
        0.0, is_leaf=tc.is_frozen
    ),
    "apply": lambda t: tc.at(t)["w"].apply(lambda _: 0.0, is_leaf=tc.is_frozen),
    "parallel apply": lambda t: tc.at(t)["w"].apply(
        lambda _: 0.0, is_leaf=tc.is_frozen, is_parallel=True
    ),
    "scan": lambda t: tc.at(t)["w"].scan(lambda _, s: (0.0, s), 0, is_leaf=tc.is_frozen)[0],
}


@pytest.mark.parametrize("put", list(_FROZEN_NUMBER_PUTS), ids=str)
def test_a_number_put_at_a_frozen_array_fills_it_and_it_stays_frozen(put):
    tree = _frozen_net()
    new = _FROZEN_NUMBER_PUTS[put](tree)
    assert tc.is_frozen(new["w"]), "a number must not unfreeze a frozen parameter"
    filled = tc.unfreeze(new["w"])
    assert type(filled) is type(tc.unfreeze(tree["w"])) and filled.dtype == jnp.float32
    assert filled.tolist() == [[0.0] * 3] * 2
    assert tc.unfreeze(tree["w"]).tolist() == [[1.0] * 3] * 2  # the input is unchanged
    assert tc.roles(new)["w"] == "frozen"


def test_a_number_put_at_frozen_numpy_arrays_keeps_their_type_and_dtype():
    new = tc.at(_frozen_net())[...].set(2, is_leaf=tc.is_frozen)
    counts = tc.unfreeze(new["n"])
    assert type(counts) is np.ndarray and counts.dtype == np.int8 and counts.tolist() == [2] * 3
    assert new["b"].tolist() == [2.0] * 3
    # a frozen number is not an array: the number replaces it, as at any non-array leaf
    assert new["lr"] == 2 and type(new["lr"]) is int


def test_a_number_that_does_not_fit_a_frozen_array_names_its_path():
    tree = _frozen_net()
    with pytest.raises(OverflowError, match=r"tree\['n'\]"):
        tc.at(tree)["n"].set(1000, is_leaf=tc.is_frozen)
    assert tc.unfreeze(tree["n"]).tolist() == [0, 1, 2]


def test_an_array_put_at_a_frozen_value_replaces_it_whole():
    # a whole value is the leaf itself: this is how a selection unfreezes
    new = tc.at(_frozen_net())["w"].set(jnp.zeros(2), is_leaf=tc.is_frozen)
    assert not tc.is_frozen(new["w"]) and new["w"].shape == (2,)


def test_frozen_values_are_skipped_when_other_leaves_are_selected():
    tree = {"a": tc.freeze(1.0), "b": 2.0}
    new = tc.at(tree)[...].set(0.0)
    assert new["b"] == 0.0 and tc.is_frozen(new["a"])


def test_name_below_frozen_value_explains():
    with pytest.raises(LookupError, match=r"'x' not found at tree\['a'\]: it is a frozen value"):
        tc.at({"a": tc.freeze(1.0)})["a"]["x"].set(0)


def test_glob_through_frozen_value_says_so():
    with pytest.raises(LookupError, match=r"(?s)reaches no leaves.*tree\['a'\] \(frozen\)"):
        tc.at({"a": tc.freeze({"w": 1.0}), "b": 2.0})[tc.glob("a.w")].set(0.0)


def test_empty_selection_near_frozen_values_is_not_an_error():
    tree = {"a": tc.freeze(1.0), "b": 2.0}
    assert tc.at(tree)[Linear].get()["b"] is None
    assert tc.at(tree)[{"a": tc.freeze(None), "b": False}].set(0.0)["b"] == 2.0


def test_real_freeze_if_available():
    try:
        frozen = tc.freeze(jnp.ones(2))
    except NotImplementedError:
        pytest.skip("tc.freeze is not built yet")
    with pytest.raises(LookupError, match="frozen"):
        tc.at({"a": frozen})["a"].set(0.0)


# -- method calls ------------------------------------------------------------------------


def test_method_call_returns_value_and_new_tree_with_added_attribute():
    model = MLP(2)
    value, new = model.at["grow"](3.0)
    assert value == "grown" and new.extra == 3.0 and float(new.layers[0].bias[0]) == 3.0
    assert not hasattr(model, "extra") and float(model.layers[0].bias[0]) == 0.0
    assert len(jax.tree_util.tree_leaves(new)) == len(jax.tree_util.tree_leaves(model)) + 1


def test_method_call_result_is_immutable_again():
    _, new = MLP(1).at["grow"](1.0)
    with pytest.raises(AttributeError):
        new.extra = 2.0
    with pytest.raises(AttributeError):
        new.layers[0].bias = 2.0


def test_method_call_deleting_attribute():
    _, new = MLP(1).at["forget"]()
    assert not hasattr(new, "scale")


def test_nested_method_call():
    model = MLP(2)
    factor, new = model.at["layers"][1]["scale"](2.0)
    assert factor == 2.0 and float(new.layers[1].weight[0, 0]) == 2.0
    assert float(model.layers[1].weight[0, 0]) == 1.0


def test_static_field_apply_with_is_parallel_gives_the_serial_result():
    mlp = MLP(2)
    for parallel in (True, {"max_workers": 2}):
        out = mlp.at["layers"][0]["name"].apply(str.upper, is_parallel=parallel)
        assert out.layers[0].name == "LINEAR" and mlp.layers[0].name == "linear"
        out = mlp.at[Linear]["name"].set("dense", is_parallel=parallel)
        assert [layer.name for layer in out.layers] == ["dense", "dense"]


@pytest.mark.skipif(sys.version_info < (3, 11), reason="error notes are Python 3.11+")
def test_static_field_apply_error_with_is_parallel_names_the_field():
    def fails(name):
        raise ValueError("no")

    with pytest.raises(ValueError, match="no") as info:
        MLP(1).at["layers"][0]["name"].apply(fails, is_parallel=True)
    assert any("MLP.layers[0].name" in note for note in getattr(info.value, "__notes__", []))


def test_method_call_may_change_static_field():
    _, new = MLP(1).at["layers"][0]["rename"]("renamed")
    assert new.layers[0].name == "renamed"


def test_method_call_on_treeclass_inside_plain_tree():
    tree = {"layer": Linear(jnp.ones(1), jnp.zeros(1))}
    factor, new = tc.at(tree)["layer"]["scale"](3.0)
    assert factor == 3.0 and float(new["layer"].weight[0]) == 3.0
    assert float(tree["layer"].weight[0]) == 1.0


def test_method_that_raises_leaves_input_untouched():
    model = MLP(1)
    with pytest.raises(RuntimeError, match="boom"):
        model.at["fail"]()
    assert float(model.layers[0].bias[0]) == 0.0


def test_method_call_on_missing_name():
    with pytest.raises(AttributeError, match=r"MLP has no method 'gro'; did you mean 'grow'\?"):
        MLP(1).at["gro"]()


def test_method_call_on_non_callable():
    with pytest.raises(TypeError, match=r"MLP\.scale is not callable"):
        MLP(1).at["scale"]()


def test_method_call_needs_a_name():
    with pytest.raises(TypeError, match="Only a method name can be called"):
        MLP(1).at[...]()


# -- speed structure (no timing): a name chain does not visit siblings ---------------------


def test_name_chain_does_not_visit_other_branches():
    class Exploding:
        """A registered node whose flatten fails: touching it would raise."""

    jax.tree_util.register_pytree_node(
        Exploding, lambda x: (_ for _ in ()).throw(AssertionError("visited")), lambda *_: None
    )
    tree = {"hot": {"w": 1.0}, "cold": Exploding()}
    new = tc.at(tree)["hot"]["w"].set(2.0)
    assert new["hot"]["w"] == 2.0 and new["cold"] is tree["cold"]


# -- properties --------------------------------------------------------------------------

leaf_values = st.floats(-10, 10, allow_nan=False, width=32)
trees = st.recursive(
    leaf_values,
    lambda children: st.one_of(
        st.lists(children, min_size=1, max_size=3),
        st.tuples(children, children),
        st.dictionaries(st.sampled_from("abcd"), children, min_size=1, max_size=3),
    ),
    max_leaves=8,
)


@st.composite
def tree_and_mask(draw):
    tree = draw(trees)
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    bits = draw(st.lists(st.booleans(), min_size=len(leaves), max_size=len(leaves)))
    return tree, jax.tree_util.tree_unflatten(treedef, bits)


_FILL = object()


@settings(max_examples=30, deadline=None)
@given(tree_and_mask(), leaf_values)
def test_property_set_then_get_returns_value_where_selected(pair, value):
    tree, mask = pair
    got = tc.at(tc.at(tree)[mask].set(value))[mask].get(fill_value=_FILL)
    flags = jax.tree_util.tree_leaves(mask)
    for leaf, selected in zip(jax.tree_util.tree_leaves(got), flags, strict=True):
        assert (leaf == value) if selected else (leaf is _FILL)


@settings(max_examples=30, deadline=None)
@given(tree_and_mask())
def test_property_apply_identity_is_identity(pair):
    tree, mask = pair
    assert leaves_equal(tc.at(tree)[mask].apply(lambda x: x), tree)
    assert leaves_equal(tc.at(tree)[...].apply(lambda x: x), tree)


@settings(max_examples=30, deadline=None)
@given(tree_and_mask())
def test_property_mask_and_complement_partition_leaves(pair):
    tree, mask = pair
    complement = jax.tree_util.tree_map(lambda b: not b, mask)
    picked = jax.tree_util.tree_leaves(tc.at(tree)[mask].get(fill_value=_FILL))
    rest = jax.tree_util.tree_leaves(tc.at(tree)[complement].get(fill_value=_FILL))
    for original, a, b in zip(jax.tree_util.tree_leaves(tree), picked, rest, strict=True):
        assert (a is _FILL) != (b is _FILL)
        assert (b if a is _FILL else a) == original


@settings(max_examples=30, deadline=None)
@given(tree_and_mask(), leaf_values, st.data())
def test_property_input_unchanged_after_every_operation(pair, value, data):
    tree, mask = pair
    snapshot = copy.deepcopy(tree)
    paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
    path = data.draw(st.sampled_from(paths))
    keys = [getattr(k, "key", getattr(k, "idx", None)) for k in path]
    chain = tc.at(tree)
    for key in keys:
        chain = chain[key]
    for indexer in (tc.at(tree)[mask], chain):
        indexer.get()
        indexer.set(value)
        indexer.apply(lambda x: x + 1)
        indexer.reduce(lambda a, b: a + b, initializer=0.0)
        indexer.scan(lambda x, s: (x * 2, s + 1), 0)
        assert tree == snapshot
    leaf = chain.set(value)
    for key in keys:
        leaf = leaf[key]
    assert leaf == value


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 4), st.data(), leaf_values)
def test_property_treeclass_input_unchanged_and_set_get_roundtrip(n, data, value):
    model = MLP(n)
    before = jax.tree_util.tree_leaves(model)
    bits = data.draw(st.lists(st.booleans(), min_size=len(before), max_size=len(before)))
    mask = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(model), bits)
    index = data.draw(st.integers(-n, n - 1))
    new = model.at["layers"][index]["bias"].set(value)
    assert (new.layers[index].bias == value).all()  # a number fills the array leaf
    got = model.at[mask].set(value).at[mask].get(fill_value=_FILL)
    for leaf, bit, old in zip(jax.tree_util.tree_leaves(got), bits, before, strict=True):
        if bit and isinstance(old, jax.Array):  # a number fills an array leaf
            assert leaf.shape == old.shape and leaf.dtype == old.dtype and (leaf == value).all()
        elif bit:  # and replaces any other leaf (`scale`, a Python float)
            assert leaf == value and type(leaf) is type(value)
        else:
            assert leaf is _FILL
    model.at[mask].apply(lambda x: x + 1)
    model.at[Linear][...].scan(lambda x, s: (x, s), 0)
    after = jax.tree_util.tree_leaves(model)
    assert all(a is b for a, b in zip(before, after, strict=True))


@settings(max_examples=30, deadline=None)
@given(tree_and_mask(), leaf_values)
def test_property_whole_tree_mask_agrees_with_the_general_walk(pair, value):
    # `at[mask]` alone takes a flatten-and-zip fast path; with an `is_leaf` it walks node
    # by node. Both must select exactly the same leaves.
    tree, mask = pair
    at = tc.at(tree)[mask]
    walk = lambda x: False  # any is_leaf turns the fast path off
    assert tc.is_tree_equal(at.set(value), at.set(value, is_leaf=walk))
    assert tc.is_tree_equal(at.apply(lambda x: x * 2), at.apply(lambda x: x * 2, is_leaf=walk))


def test_whole_tree_mask_with_element_masks_and_frozen_leaves_matches_general_walk():
    tree = {"w": jnp.arange(-2.0, 2.0), "s": tc.freeze("relu"), "b": jnp.float32(3.0)}
    mask = {"w": tree["w"] > 0, "s": tc.freeze("relu"), "b": False}
    fast = tc.at(tree)[mask].set(9.0)
    walked = tc.at(tree)[mask].set(9.0, is_leaf=lambda x: False)
    assert tc.is_tree_equal(fast, walked)
    np.testing.assert_array_equal(fast["w"], [-2.0, -1.0, 0.0, 9.0])
    assert fast["s"] is tree["s"] and fast["b"] is tree["b"]


# -- a class or predicate that reaches a frozen value, with more selectors after it -----------


class _Lin(tc.TreeClass):
    weight: object
    bias: object


def _with_frozen_twin():
    return {"a": _Lin(jnp.ones(2), jnp.zeros(2)), "b": tc.freeze(_Lin(jnp.ones(2), jnp.zeros(2)))}


@pytest.mark.parametrize(
    "selector",
    [_Lin, tc.where(lambda path, node: isinstance(node, _Lin))],
    ids=["class", "where"],
)
def test_a_frozen_match_is_passed_by_when_more_selectors_follow(selector):
    tree = _with_frozen_twin()
    got = tc.at(tree)[selector]["weight"].get()
    assert got["a"].weight.tolist() == [1.0, 1.0] and got["b"] is tree["b"]  # no leaves to fill
    new = tc.at(tree)[selector]["weight"].set(5.0)
    assert new["a"].weight.tolist() == [5.0, 5.0]
    assert new["b"] is tree["b"] and tc.unfreeze(new["b"]).weight.tolist() == [1.0, 1.0]
    applied = tc.at(tree)[selector]["weight"].apply(lambda w: w * 3)
    assert applied["a"].weight.tolist() == [3.0, 3.0] and applied["b"] is tree["b"]


@pytest.mark.parametrize(
    "selector",
    [_Lin, tc.where(lambda path, node: isinstance(node, _Lin))],
    ids=["class", "where"],
)
def test_a_frozen_match_alone_is_still_selected_to_thaw(selector):
    tree = _with_frozen_twin()
    thawed = tc.at(tree)[selector].apply(tc.unfreeze, is_leaf=tc.is_frozen)
    assert not tc.is_frozen(thawed["b"]) and isinstance(thawed["b"], _Lin)


def test_only_frozen_matches_with_more_selectors_say_so():
    tree = {"b": tc.freeze(_Lin(jnp.ones(2), jnp.zeros(2)))}
    with pytest.raises(LookupError, match=r"tree\['b'\] \(frozen\)"):
        tc.at(tree)[_Lin]["weight"].set(0.0)


@pytest.mark.parametrize(
    "fn",
    [tc.freeze, lambda x: {"a": x}, lambda x: "text"],
    ids=["freeze", "subtree", "string"],
)
@pytest.mark.parametrize("op", ["apply", "set"])
def test_an_element_mask_refuses_a_value_that_is_no_array_naming_the_leaf(fn, op):
    tree = {"w": jnp.arange(4.0)}
    selection = tc.at(tree)[{"w": jnp.array([True, False, True, False])}]
    with pytest.raises(TypeError, match=r"(?s)tree\['w'\].*element mask.*whole leaf"):
        if op == "apply":
            selection.apply(fn)
        else:
            selection.set(fn(tree["w"]))
    assert tree["w"].tolist() == [0.0, 1.0, 2.0, 3.0]


# -- numbers at array leaves: an array stays an array ------------------------------------------


class _Net(tc.TreeClass):
    def __init__(self):
        self.dense = Linear(jnp.ones((2, 3)), jnp.ones(3))
        self.counts = np.arange(4, dtype=np.int8)
        self.step = jnp.zeros((), jnp.int32)
        self.eps = 1e-5


def _shapes_and_dtypes(tree):
    return [
        (type(x).__name__, x.shape, x.dtype) if hasattr(x, "dtype") else type(x)
        for x in jax.tree_util.tree_leaves(tree)
    ]


def _bias_selectors():
    net = _Net()
    return {
        "name": ("dense", "bias"),
        "regex": ("dense", re.compile("b.*")),
        "glob": (tc.glob("**.bias"),),
        "class": (Linear, "bias"),
        "where": (tc.where(lambda path, x: path[-1] == jax.tree_util.GetAttrKey("bias")),),
        "bool mask": (net.at[...].set(False).at["dense"]["bias"].set(True),),
        "element mask": (net.at[...].set(False).at["dense"]["bias"].set(jnp.ones(3, bool)),),
    }


@pytest.mark.parametrize("selector", list(_bias_selectors()), ids=str)
def test_a_number_set_at_an_array_leaf_keeps_its_shape_and_dtype(selector):
    net = _Net()
    new = tc.at(net, where=list(_bias_selectors()[selector])).set(0)
    assert type(new.dense.bias) is type(net.dense.bias)
    assert new.dense.bias.dtype == jnp.float32 and new.dense.bias.tolist() == [0.0] * 3
    assert new.dense.weight is net.dense.weight
    assert tc.roles(new).dense.bias == "trainable"


def test_a_number_set_everywhere_fills_jax_and_numpy_arrays_and_replaces_other_leaves():
    net = _Net()
    new = net.at[...].set(3)
    assert _shapes_and_dtypes(new) == [*_shapes_and_dtypes(net)[:-1], int]
    assert type(new.counts) is np.ndarray and new.counts.tolist() == [3] * 4
    assert new.step.dtype == jnp.int32 and int(new.step) == 3
    assert new.eps == 3 and type(new.eps) is int  # not an array: the number itself
    assert net.dense.bias.tolist() == [1.0] * 3  # the input is unchanged


def test_a_numpy_scalar_is_a_number_and_fits_the_leaf_dtype():
    new = _Net().at["dense"]["bias"].set(np.float64(0.25))
    assert new.dense.bias.dtype == jnp.float32 and new.dense.bias.tolist() == [0.25] * 3
    assert _Net().at["counts"].set(np.int64(-2)).counts.dtype == np.int8


@pytest.mark.parametrize("transform", ["jit", "vmap", "eval_shape"])
def test_a_number_set_under_a_transformation_keeps_shapes_and_dtypes(transform):
    net = _Net()

    def zero(n):
        return n.at[tc.glob("dense.*")].set(0.0).at["step"].set(7)

    if transform == "jit":
        out = jax.jit(zero)(net)
        assert out.dense.weight.tolist() == [[0.0] * 3] * 2 and int(out.step) == 7
    elif transform == "vmap":
        batched = jax.vmap(lambda w: zero(net.at["dense"]["weight"].set(w)).dense.weight)
        assert batched(jnp.ones((4, 2, 3))).shape == (4, 2, 3)
        return
    else:
        out = jax.eval_shape(zero, net)
    assert out.dense.weight.shape == (2, 3) and out.dense.weight.dtype == jnp.float32
    assert out.step.shape == () and out.step.dtype == jnp.int32


def test_bools_are_flags_so_set_false_still_builds_a_mask():
    mask = _Net().at[...].set(False).at[Linear]["weight"].set(True)
    assert jax.tree_util.tree_leaves(mask) == [True, False, False, False, False]


def test_apply_whole_puts_the_number_in_place_of_the_array():
    new = _Net().at["dense"]["bias"].apply(lambda _: 0.0, whole=True)
    assert new.dense.bias == 0.0 and type(new.dense.bias) is float


@pytest.mark.parametrize("parallel", [False, True])
def test_apply_and_scan_returning_a_number_fill_the_array(parallel):
    net = _Net()
    applied = net.at[Linear][...].apply(lambda _: 2, is_parallel=parallel)
    assert applied.dense.weight.shape == (2, 3) and applied.dense.weight.dtype == jnp.float32
    assert applied.dense.bias.tolist() == [2.0] * 3
    scanned, n = net.at[Linear][...].scan(lambda x, s: (s, s + 1), 0)
    assert n == 2 and scanned.dense.weight.tolist() == [[0.0] * 3] * 2
    assert scanned.dense.bias.tolist() == [1.0] * 3


def test_whole_tree_mask_fast_path_fills_arrays_too():
    tree = {"w": jnp.ones(3), "n": np.arange(3, dtype=np.int64), "s": 1.5}
    mask = {"w": True, "n": np.array([True, False, True]), "s": True}
    new = tc.at(tree)[mask].set(0)
    assert new["w"].tolist() == [0.0] * 3 and new["w"].dtype == jnp.float32
    assert type(new["n"]) is np.ndarray and new["n"].dtype == np.int64
    assert new["n"].tolist() == [0, 1, 0] and new["s"] == 0


@pytest.mark.parametrize(
    ("where", "value", "error", "reason"),
    [
        (("counts",), 2.7, TypeError, "2.7 is not an integer"),
        (("counts",), 300, OverflowError, "int8 holds the integers -128 to 127"),
        (("dense", "bias"), 1j, TypeError, "imaginary part does not fit float32"),
        (("step",), float("nan"), TypeError, "nan is not an integer"),
    ],
)
def test_a_number_that_does_not_fit_the_leaf_dtype_names_the_leaf(where, value, error, reason):
    net = _Net()
    before = jax.tree_util.tree_leaves(net)
    for op in (
        lambda at: at.set(value),
        lambda at: at.apply(lambda _: value),
        lambda at: at.set(value, is_leaf=lambda x: False),  # the walk, not the fast path
    ):
        with pytest.raises(error, match=re.escape(reason)) as info:
            op(tc.at(net, where=list(where)))
        assert f"_Net.{'.'.join(where)}" in str(info.value)
        assert "whole=True" in str(info.value)
    assert all(a is b for a, b in zip(before, jax.tree_util.tree_leaves(net), strict=True))


def test_a_number_under_an_element_mask_must_fit_and_keeps_the_dtype():
    tree = {"n": jnp.arange(4, dtype=jnp.int8)}
    mask = {"n": tree["n"] > 1}
    assert tc.at(tree)[mask].set(0.0)["n"].dtype == jnp.int8
    with pytest.raises(TypeError, match=r"tree\['n'\].*2.5 is not an integer"):
        tc.at(tree)[mask].set(2.5)
    with pytest.raises(TypeError, match=r"2.5 is not an integer"):
        tc.at(tree)[mask].apply(lambda _: 2.5, is_leaf=lambda x: False)


def test_a_number_cannot_be_put_into_a_key_array():
    with pytest.raises(TypeError, match=r"tree\['k'\].*holds no numbers"):
        tc.at({"k": jax.random.key(0)})["k"].set(0)


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(sorted(_bias_selectors())), st.floats(-1e3, 1e3, allow_nan=False))
def test_property_setting_a_float_never_changes_an_inexact_leaf_shape_or_dtype(name, value):
    net = _Net()
    new = tc.at(net, where=list(_bias_selectors()[name])).set(value)
    assert _shapes_and_dtypes(new) == _shapes_and_dtypes(net)


# -- a selection as a value: `.mask()` and `.paths()` ---------------------------------------


def test_mask_has_the_trees_structure_and_flags_the_selected_leaves():
    tree = {"a": jnp.ones(2), "b": [1.0, {"c": 2.0}], "f": tc.freeze("x")}
    mask = tc.at(tree)["b"][1]["c"].mask()
    assert mask == {"a": False, "b": [False, {"c": True}], "f": tc.freeze("x")}
    assert jax.tree_util.tree_structure(mask) == jax.tree_util.tree_structure(tree)


def test_mask_gives_frozen_values_a_flag_of_their_own_with_is_leaf():
    tree = {"w": jnp.ones(2), "f": tc.freeze("x")}
    assert tc.at(tree)["f"].mask(is_leaf=tc.is_frozen) == {"w": False, "f": True}
    assert tc.at(tree)["f"].paths(is_leaf=tc.is_frozen) == [(jax.tree_util.DictKey("f"),)]


def test_mask_of_an_element_mask_is_that_mask_at_its_leaf():
    tree = {"w": jnp.array([1.0, -2.0, 3.0]), "b": 0.0}
    mask = tc.at(tree)[tc.where(lambda path, x: x > 0 if path[-1].key == "w" else False)].mask()
    assert mask["w"].tolist() == [True, False, True] and mask["b"] is False
    assert tc.at(tree)[mask].get()["w"].tolist() == [1.0, 3.0]


def test_mask_of_some_blocks_of_a_stack_is_one_flag_per_block():
    model = {"blocks": tc.Stacked({"w": jnp.ones((4, 2))}), "head": jnp.zeros(2)}
    selection = tc.at(model)["blocks"][1:3]["w"]
    mask = selection.mask()
    assert mask["blocks"].tree["w"].tolist() == [False, True, True, False]
    assert mask["head"] is False
    assert selection.paths() == [(jax.tree_util.DictKey("blocks"), jax.tree_util.DictKey("w"))]
    again = tc.at(model)[mask].set(5.0)
    assert again["blocks"].tree["w"][:, 0].tolist() == [1.0, 5.0, 5.0, 1.0]


def test_paths_are_the_selected_leaves_in_flatten_order():
    tree = {"b": {"y": 1.0, "x": 2.0}, "a": [3.0, 4.0]}
    paths = tc.at(tree)[tc.glob("**")].paths()
    assert paths == [p for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
    assert [jax.tree_util.keystr(p) for p in tc.at(tree)["b"]["x"].paths()] == ["['b']['x']"]


def test_mask_of_a_selector_naming_nothing_is_an_error_naming_the_closest_key():
    with pytest.raises(LookupError, match="weigth"):
        tc.at({"weight": 1.0})[tc.glob("weigth")].mask()


def test_mask_leaves_the_tree_as_it_was():
    tree = {"a": [1.0, 2.0]}
    tc.at(tree)["a"][0].mask()
    assert tree == {"a": [1.0, 2.0]}


@settings(max_examples=30, deadline=None)
@given(tree_and_mask())
def test_property_a_selections_mask_selects_what_the_selection_does(pair):
    tree, selector = pair
    selection = tc.at(tree)[selector]
    mask = selection.mask()
    assert jax.tree_util.tree_leaves(mask) == jax.tree_util.tree_leaves(selector)
    assert tc.is_tree_equal(tc.at(tree)[mask].get(), selection.get())
    flags = jax.tree_util.tree_leaves(mask)
    pairs = jax.tree_util.tree_flatten_with_path(tree)[0]
    assert selection.paths() == [p for (p, _), flag in zip(pairs, flags) if flag]


@settings(max_examples=30, deadline=None)
@given(trees, st.sampled_from(["a", "b", 0, 1]))
def test_property_the_mask_of_a_name_flags_exactly_the_leaves_get_keeps(tree, key):
    try:
        selection = tc.at(tree)[key]
        kept = selection.get(fill_value=_FILL)
    except (LookupError, IndexError):
        with pytest.raises((LookupError, IndexError)):
            tc.at(tree)[key].mask()
        return
    flags = jax.tree_util.tree_leaves(selection.mask())
    assert flags == [x is not _FILL for x in jax.tree_util.tree_leaves(kept)]


_array_leaves = st.builds(
    lambda shape, dtype, frozen: (tc.freeze if frozen else (lambda x: x))(
        np.ones(shape, dtype) if dtype == "int8" else jnp.ones(shape, dtype)
    ),
    st.sampled_from([(), (2,), (2, 3)]),
    st.sampled_from(["float32", "bfloat16", "int8"]),
    st.booleans(),
)
_array_trees = st.recursive(
    _array_leaves,
    lambda children: st.dictionaries(st.sampled_from("abc"), children, min_size=1, max_size=3),
    max_leaves=6,
)


def _layout(tree):
    """Each leaf (frozen values counted as leaves) as (frozen?, type, shape, dtype)."""
    return [
        (tc.is_frozen(x), type(tc.unfreeze(x)), np.shape(tc.unfreeze(x)), tc.unfreeze(x).dtype)
        for x in jax.tree_util.tree_leaves(tree, is_leaf=tc.is_frozen)
    ]


@settings(max_examples=40, deadline=None)
@given(_array_trees, st.integers(-100, 100))
def test_property_a_number_set_never_changes_what_kind_of_leaf_is_there(tree, number):
    # frozen or not, NumPy or JAX, any dtype holding the number: structure, frozenness,
    # type, shape and dtype of every leaf stay, and every value becomes the number
    new = tc.at(tree)[...].set(number, is_leaf=tc.is_frozen)
    assert jax.tree_util.tree_structure(new, is_leaf=tc.is_frozen) == (
        jax.tree_util.tree_structure(tree, is_leaf=tc.is_frozen)
    )
    assert _layout(new) == _layout(tree)
    for x in jax.tree_util.tree_leaves(new, is_leaf=tc.is_frozen):
        assert np.all(np.asarray(tc.unfreeze(x), np.float32) == number)
