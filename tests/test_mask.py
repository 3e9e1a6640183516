"""Tests for treeclass._mask: freeze / unfreeze / is_frozen, is_nondiff, tree_mask / tree_unmask."""

from __future__ import annotations

import copy
import pickle
import textwrap
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import Linear
from hypothesis import given, settings
from hypothesis import strategies as st

import treeclass as tc

pytestmark = pytest.mark.usefixtures("strict_jax")


class Dropout(tc.TreeClass):
    rate: float
    deterministic: bool = False


class Block(tc.TreeClass):
    def __init__(self, key: jax.Array) -> None:
        k1, k2 = jax.random.split(key)
        self.encoder = Linear(jax.random.normal(k1, (3, 4)), jnp.zeros(4))
        self.dropout = Dropout(0.1)
        self.decoder = Linear(jax.random.normal(k2, (4, 2)), jnp.zeros(2), name="decoder")
        self.act = "relu"
        self.steps = 3


def _indexer_ready() -> bool:
    try:
        tc.at({"a": 1})["a"].get()
        return True
    except Exception:
        return False


needs_indexer = pytest.mark.skipif(not _indexer_ready(), reason="the .at indexer is not built yet")


# ------------------------------------------------------------------------------------------
# freeze / unfreeze / is_frozen
# ------------------------------------------------------------------------------------------


def test_freeze_marks_repr_with_hash_sign():
    assert repr(tc.freeze(1.0)) == "#1.0"
    assert repr(tc.freeze("relu")) == "#'relu'"
    assert str(tc.freeze("relu")) == "#relu"


def test_is_frozen_only_for_frozen_values():
    assert tc.is_frozen(tc.freeze(1))
    assert not tc.is_frozen(1)
    assert not tc.is_frozen(tc.unfreeze(tc.freeze(1)))


def test_freeze_is_idempotent():
    frozen = tc.freeze(jnp.ones(2))
    assert tc.freeze(frozen) is frozen


def test_unfreeze_returns_the_wrapped_object():
    value = jnp.ones(3)
    assert tc.unfreeze(tc.freeze(value)) is value


def test_unfreeze_of_unfrozen_value_is_identity():
    value = object()
    assert tc.unfreeze(value) is value


@pytest.mark.parametrize(
    "value", [1.0, 2, "relu", None, jnp.ones((2, 3)), np.arange(3), print, (jnp.ones(2), 1)]
)
def test_frozen_value_has_no_leaves(value):
    assert jax.tree_util.tree_leaves(tc.freeze(value)) == []
    assert jax.tree_util.tree_structure(tc.freeze(value)).num_leaves == 0


def test_frozen_subtree_hides_every_leaf():
    tree = {"a": jnp.ones(2), "frozen": tc.freeze({"b": jnp.ones(3), "c": [jnp.zeros(1)]})}
    assert len(jax.tree_util.tree_leaves(tree)) == 1


def test_frozen_value_survives_tree_map_as_the_same_object():
    frozen = tc.freeze(jnp.ones(2))
    mapped = jax.tree_util.tree_map(lambda x: x + 1, {"a": 1.0, "b": frozen})
    assert mapped["b"] is frozen and mapped["a"] == 2.0


def test_equal_scalars_frozen_separately_are_equal_with_equal_hash():
    a, b = tc.freeze(1.5), tc.freeze(1.5)
    assert a is not b and a == b and hash(a) == hash(b)


def test_equal_python_values_of_different_types_are_not_equal_frozen():
    assert tc.freeze(1) != tc.freeze(1.0)
    assert tc.freeze(1) != tc.freeze(True)


def test_equal_distinct_arrays_are_equal_frozen():
    a, b = tc.freeze(jnp.arange(4.0)), tc.freeze(jnp.arange(4.0))
    assert a == b and hash(a) == hash(b)


@pytest.mark.parametrize(
    "other",
    [jnp.arange(4.0) + 1, jnp.arange(4), jnp.arange(4.0).reshape(2, 2), np.arange(4.0)],
    ids=["values", "dtype", "shape", "numpy"],
)
def test_arrays_differing_in_values_dtype_shape_or_type_are_not_equal_frozen(other):
    assert tc.freeze(jnp.arange(4.0)) != tc.freeze(other)


def test_frozen_arrays_compare_bitwise_so_nan_equals_nan():
    a, b = tc.freeze(jnp.array([jnp.nan, 1.0])), tc.freeze(jnp.array([jnp.nan, 1.0]))
    assert a == b


@pytest.mark.parametrize(
    "make",
    [lambda: jnp.ones(3, jnp.bfloat16), lambda: jnp.zeros((0, 3)), lambda: jnp.array(2.0),
     lambda: np.arange(6.0).reshape(2, 3).T],
    ids=["bfloat16", "empty", "0-d", "non-contiguous"],
)  # fmt: skip
def test_unusual_arrays_frozen_separately_are_equal(make):
    assert tc.freeze(make()) == tc.freeze(make())


def test_object_arrays_fall_back_to_identity():
    array = np.array([1, "a"], dtype=object)
    assert tc.freeze(array) == tc.freeze(array)
    assert tc.freeze(array) != tc.freeze(array.copy())


def test_frozen_key_arrays_compare_by_key_data():
    assert tc.freeze(jax.random.key(0)) == tc.freeze(jax.random.key(0))
    assert tc.freeze(jax.random.key(0)) != tc.freeze(jax.random.key(1))


def test_equal_distinct_frozen_subtrees_are_equal():
    a = tc.freeze({"w": jnp.ones(2), "n": [1, "x"]})
    b = tc.freeze({"w": jnp.ones(2), "n": [1, "x"]})
    assert a == b and hash(a) == hash(b)
    assert a != tc.freeze({"w": jnp.ones(2), "n": [2, "x"]})


def test_frozen_treeclass_compares_by_value():
    a = tc.freeze(Linear(jnp.ones((2, 2)), jnp.zeros(2)))
    b = tc.freeze(Linear(jnp.ones((2, 2)), jnp.zeros(2)))
    assert a == b
    assert a != tc.freeze(Linear(jnp.ones((2, 2)), jnp.zeros(2), name="other"))


class _Unhashable:
    __hash__ = None  # type: ignore[assignment]

    def __eq__(self, other):
        return True


def test_unhashable_object_falls_back_to_identity():
    obj = _Unhashable()
    assert tc.freeze(obj) == tc.freeze(obj)
    assert tc.freeze(obj) != tc.freeze(_Unhashable())
    hash(tc.freeze(obj))


class _ElementwiseEq:
    def __hash__(self):
        return 0

    def __eq__(self, other):
        return np.array([True, False])


def test_value_whose_eq_has_no_truth_value_is_only_equal_to_itself():
    value = _ElementwiseEq()
    assert tc.freeze(value) == tc.freeze(value)
    assert tc.freeze(value) != tc.freeze(_ElementwiseEq())


class _CountingEq:
    calls = 0

    def __hash__(self):
        return 1

    def __eq__(self, other):
        type(self).calls += 1
        return isinstance(other, _CountingEq)


def test_equality_checks_identity_before_the_value():
    frozen = tc.freeze(_CountingEq())
    assert frozen == frozen and tc.freeze(frozen) == frozen
    assert _CountingEq.calls == 0
    assert frozen == tc.freeze(_CountingEq())
    assert _CountingEq.calls == 1


def test_frozen_value_is_not_equal_to_the_unfrozen_value():
    assert tc.freeze(1) != 1


OPERATIONS = {
    "x + y": lambda x: x + 1,
    "y + x": lambda x: 1 + x,
    "x * y": lambda x: x * 2,
    "x @ y": lambda x: x @ x,
    "x ** y": lambda x: x**2,
    "-x": lambda x: -x,
    "x < y": lambda x: x < 1,
    "x(...)": lambda x: x(),
    "x[i]": lambda x: x[0],
    "iter(x)": lambda x: list(x),
    "jnp.asarray(x)": lambda x: jnp.asarray(x),
    "np.asarray(x)": lambda x: np.asarray(x),
}


@pytest.mark.parametrize("expr", list(OPERATIONS))
def test_operations_on_frozen_value_say_to_unfreeze_first(expr):
    frozen = tc.freeze(jnp.ones(2))
    with pytest.raises(TypeError, match=r"(?s)frozen value.*Unfreeze it first.*tc\.unfreeze\(x\)"):
        OPERATIONS[expr](frozen)


def test_error_shows_the_expression_and_its_fix():
    with pytest.raises(TypeError, match=r"before: x \+ y\n    after:  tc\.unfreeze\(x\) \+ y"):
        tc.freeze(1.0) + 1


def test_calling_a_frozen_function_raises():
    with pytest.raises(TypeError, match=r"`x\(\.\.\.\)` with the frozen value x = #lambda\(\)"):
        tc.freeze(lambda: 1)()


def test_attribute_of_a_frozen_value_says_to_unfreeze_first():
    with pytest.raises(AttributeError, match=r"(?s)no attribute 'T'.*tc\.unfreeze\(x\)\.T"):
        _ = tc.freeze(jnp.ones(2)).T


def test_frozen_value_is_immutable():
    frozen = tc.freeze(1)
    with pytest.raises(AttributeError, match="frozen value is immutable"):
        frozen._value = 2
    with pytest.raises(AttributeError, match="frozen value is immutable"):
        del frozen._value
    assert tc.unfreeze(frozen) == 1


def test_copy_returns_the_same_frozen_value():
    frozen = tc.freeze([1, 2])
    assert copy.copy(frozen) is frozen


def test_deepcopy_copies_the_wrapped_value():
    inner = [1, 2]
    copied = copy.deepcopy(tc.freeze(inner))
    assert tc.is_frozen(copied) and copied == tc.freeze([1, 2])
    assert tc.unfreeze(copied) is not inner


@pytest.mark.parametrize("value", [1.0, "relu", (1, 2), jnp.arange(3.0), np.ones(2)])
def test_pickle_round_trip_is_equal_with_equal_hash(value):
    frozen = tc.freeze(value)
    loaded = pickle.loads(pickle.dumps(frozen))
    assert tc.is_frozen(loaded) and loaded == frozen and hash(loaded) == hash(frozen)


def test_pickle_of_a_tree_with_frozen_leaves():
    tree = {"w": jnp.ones(2), "act": tc.freeze("relu")}
    loaded = pickle.loads(pickle.dumps(tree))
    assert jax.tree_util.tree_structure(loaded) == jax.tree_util.tree_structure(tree)


def test_freezing_a_tracer_does_not_fail():
    @jax.jit
    def f(x):
        frozen = tc.freeze(x)
        return tc.unfreeze(frozen) * 2

    assert f(jnp.ones(2)).tolist() == [2.0, 2.0]


# ------------------------------------------------------------------------------------------
# is_nondiff
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [1, True, "relu", None, print, object(), jnp.arange(3), jnp.ones(2, bool), np.int32(1),
     np.arange(2), jax.random.key(0), jax.ShapeDtypeStruct((2,), jnp.int32)],
    ids=lambda v: type(v).__name__,
)  # fmt: skip
def test_is_nondiff_true_for_what_grad_cannot_differentiate(value):
    assert tc.is_nondiff(value)


@pytest.mark.parametrize(
    "value",
    [1.0, 1j, jnp.ones(2), jnp.ones(2, jnp.bfloat16), jnp.ones(2, jnp.complex64),
     np.float32(1.0), np.ones(2), jax.ShapeDtypeStruct((2,), jnp.float32)],
    ids=lambda v: type(v).__name__,
)  # fmt: skip
def test_is_nondiff_false_for_inexact_scalars_and_arrays(value):
    assert not tc.is_nondiff(value)


def test_is_nondiff_on_tracers_follows_the_dtype():
    seen = {}

    @jax.jit
    def f(x, n):
        seen["x"], seen["n"] = tc.is_nondiff(x), tc.is_nondiff(n)
        return x

    f(jnp.ones(2), jnp.arange(2))
    assert seen == {"x": False, "n": True}


# ------------------------------------------------------------------------------------------
# tree_mask / tree_unmask
# ------------------------------------------------------------------------------------------


def test_tree_mask_default_freezes_nondifferentiable_leaves():
    tree = {"w": jnp.ones(2), "n": 3, "act": "relu", "ids": jnp.arange(2), "lr": 0.1}
    masked = tc.tree_mask(tree)
    assert {k for k, v in masked.items() if tc.is_frozen(v)} == {"n", "act", "ids"}
    assert jax.tree_util.tree_leaves(masked) == [masked["lr"], masked["w"]]


def test_tree_mask_with_a_predicate():
    masked = tc.tree_mask({"a": 1.0, "b": 2.0}, lambda x: x > 1.5)
    assert masked["a"] == 1.0 and masked["b"] == tc.freeze(2.0)


def test_tree_mask_with_a_bool_mask_tree():
    tree = {"a": jnp.ones(2), "b": [1.0, 2.0]}
    masked = tc.tree_mask(tree, {"a": True, "b": [False, True]})
    assert tc.is_frozen(masked["a"]) and masked["b"][0] == 1.0 and tc.is_frozen(masked["b"][1])


def test_tree_mask_accepts_numpy_and_jax_bool_scalars_in_the_mask():
    masked = tc.tree_mask([1, 2], [np.bool_(True), jnp.array(False)])
    assert tc.is_frozen(masked[0]) and masked[1] == 2


def test_tree_mask_keeps_the_treeclass_and_static_fields():
    block = Block(jax.random.key(0))
    masked = tc.tree_mask(block)
    assert type(masked) is Block and type(masked.decoder) is Linear
    assert masked.decoder.name == "decoder"
    assert tc.is_frozen(masked.act) and tc.is_frozen(masked.steps)
    assert tc.is_frozen(masked.dropout.deterministic) and not tc.is_frozen(masked.dropout.rate)


def test_tree_mask_does_not_mutate_the_input():
    block = Block(jax.random.key(0))
    before = dict(vars(block))
    tc.tree_mask(block, lambda _: True)
    assert vars(block) == before
    tree = {"a": 1, "b": [2]}
    tc.tree_mask(tree)
    assert tree == {"a": 1, "b": [2]}


def test_tree_mask_leaves_already_frozen_values_frozen():
    frozen = tc.freeze(2.0)
    masked = tc.tree_mask({"a": frozen, "b": 1.0}, lambda _: False)
    assert masked["a"] is frozen


def test_tree_mask_with_is_leaf_freezes_a_whole_subtree():
    block = Block(jax.random.key(0))
    masked = tc.tree_mask(
        block, lambda x: isinstance(x, Linear), is_leaf=lambda x: isinstance(x, Linear)
    )
    assert tc.is_frozen(masked.encoder) and tc.is_frozen(masked.decoder)
    assert len(jax.tree_util.tree_leaves(masked)) == 4  # rate, deterministic, act, steps


def test_tree_mask_a_mask_with_frozen_positions_as_leaves_also_fits():
    tree = {"a": tc.freeze(1), "b": 2}
    masked = tc.tree_mask(tree, {"a": False, "b": True})
    assert masked == {"a": tc.freeze(1), "b": tc.freeze(2)}


def test_tree_mask_mask_missing_a_key_names_the_key_path():
    tree = {"a": 1, "b": {"c": 2, "d": 3}}
    with pytest.raises(ValueError, match=r"at `tree\['b'\]`.*missing in the mask: \['d'\]"):
        tc.tree_mask(tree, {"a": True, "b": {"c": True}})


def test_tree_mask_mask_with_a_shorter_list_names_the_key_path():
    with pytest.raises(ValueError, match=r"at `tree\['b'\]`.*missing in the mask: \[1\]"):
        tc.tree_mask({"a": 1, "b": [1, 2]}, {"a": True, "b": [True]})


def test_tree_mask_mask_with_a_node_where_the_tree_has_a_leaf():
    expected = r"at `tree\['a'\]`: the tree has a leaf, 1 \(an `int`\).* a `list`"
    with pytest.raises(ValueError, match=expected):
        tc.tree_mask({"a": 1}, {"a": [True]})


def test_tree_mask_mask_of_another_type_names_the_key_path():
    block = Block(jax.random.key(0))
    mask = jax.tree_util.tree_map(lambda _: True, block)
    mask = {"encoder": mask.encoder}
    with pytest.raises(
        ValueError,
        match=r"at `Block`: the tree has a `Block` with children "
        r"\('encoder'.*the mask has a `dict`",
    ):
        tc.tree_mask(block, mask)


class Pair(tc.TreeClass):
    first: Any
    second: Any


def _pair() -> Pair:
    return Pair(Linear(jnp.ones((2, 2)), jnp.zeros(2)), Linear(jnp.ones((2, 2)), jnp.zeros(2)))


def test_tree_mask_mask_of_a_treeclass_names_the_field_path():
    mask = Pair(Linear(True, True), Linear(True, [True]))
    with pytest.raises(ValueError, match=r"at `Pair\.second\.bias`: the tree has a leaf"):
        tc.tree_mask(_pair(), mask)


def test_tree_mask_mask_differing_in_static_fields_names_the_node():
    mask = Pair(Linear(True, True), Linear(True, True, name="renamed"))
    with pytest.raises(ValueError, match=r"at `Pair\.second`: .*static data"):
        tc.tree_mask(_pair(), mask)


def test_tree_mask_mask_leaf_that_is_not_a_bool_names_the_key_path():
    with pytest.raises(ValueError, match=r"the mask has 1 at `tree\['b'\]\[1\]`, expected True"):
        tc.tree_mask({"a": 1, "b": [1, 2]}, {"a": True, "b": [True, 1]})


def test_tree_mask_mask_leaf_that_is_a_bool_array_is_refused():
    with pytest.raises(ValueError, match=r"at `tree\['a'\]`, expected True or False"):
        tc.tree_mask({"a": jnp.ones(2)}, {"a": jnp.array([True, False])})


def test_tree_mask_failure_leaves_the_input_unchanged():
    tree = {"a": 1, "b": [1, 2]}
    with pytest.raises(ValueError):
        tc.tree_mask(tree, {"a": True, "b": [True]})
    assert tree == {"a": 1, "b": [1, 2]}


def test_tree_unmask_unfreezes_everything_by_default():
    tree = {"a": tc.freeze(1), "b": [tc.freeze("x"), 2.0], "c": tc.freeze({"d": 1})}
    assert tc.tree_unmask(tree) == {"a": 1, "b": ["x", 2.0], "c": {"d": 1}}


def test_tree_unmask_predicate_gets_the_unfrozen_value():
    tree = {"a": tc.freeze(1), "b": tc.freeze("x")}
    unmasked = tc.tree_unmask(tree, lambda v: isinstance(v, int))
    assert unmasked["a"] == 1 and unmasked["b"] == tc.freeze("x")


def test_tree_unmask_with_the_mask_given_to_tree_mask():
    tree = {"a": 1, "b": 2, "c": 3.0}
    mask = {"a": True, "b": True, "c": False}
    masked = tc.tree_mask(tree, mask)
    partly = tc.tree_unmask(masked, {"a": True, "b": False, "c": False})
    assert partly == {"a": 1, "b": tc.freeze(2), "c": 3.0}


def test_tree_unmask_mask_that_does_not_fit_names_the_key_path():
    masked = tc.tree_mask({"a": 1, "b": [1, 2]})
    with pytest.raises(ValueError, match=r"at `tree\['b'\]`.*missing in the mask: \[1\]"):
        tc.tree_unmask(masked, {"a": True, "b": [True]})


def test_tree_unmask_does_not_mutate_the_input():
    masked = tc.tree_mask(Block(jax.random.key(0)))
    before = dict(vars(masked))
    tc.tree_unmask(masked)
    assert vars(masked) == before and tc.is_frozen(masked.act)


def test_tree_unmask_of_tree_mask_restores_a_treeclass():
    block = Block(jax.random.key(0))
    assert tc.is_tree_equal(tc.tree_unmask(tc.tree_mask(block)), block)


def test_tree_mask_with_a_treeclass_mask_whose_class_is_callable():
    class Layer(tc.TreeClass):
        w: float

        def __call__(self, x):
            return self.w * x

    masked = tc.tree_mask(Layer(1.0), Layer(True))
    assert tc.is_frozen(masked.w)


# ------------------------------------------------------------------------------------------
# through the indexer
# ------------------------------------------------------------------------------------------


@needs_indexer
def test_freeze_every_instance_of_a_class_with_the_indexer():
    block = Block(jax.random.key(0))
    frozen = block.at[Dropout].apply(tc.freeze)
    assert tc.is_frozen(frozen.dropout) or tc.is_frozen(frozen.dropout.rate)
    leaves = jax.tree_util.tree_leaves(frozen)
    assert len(leaves) == len(jax.tree_util.tree_leaves(block)) - 2
    assert not tc.is_frozen(block.dropout) and not tc.is_frozen(block.dropout.rate)


@needs_indexer
def test_freeze_a_named_subtree_with_the_indexer():
    block = Block(jax.random.key(0))
    frozen = block.at["encoder"].apply(tc.freeze)
    hidden = {id(x) for x in jax.tree_util.tree_leaves(block.encoder)}
    assert not any(id(x) in hidden for x in jax.tree_util.tree_leaves(frozen))
    assert tc.is_tree_equal(tc.tree_unmask(frozen), block)


@needs_indexer
def test_freeze_through_at_function_on_a_dict():
    tree = {"a": jnp.ones(2), "b": {"c": 1.0}}
    frozen = tc.at(tree)["b"]["c"].apply(tc.freeze)
    assert tc.is_frozen(frozen["b"]["c"]) and not tc.is_frozen(tree["b"]["c"])


@needs_indexer
def test_mask_built_with_the_indexer_fits_tree_mask():
    block = Block(jax.random.key(0))
    mask = tc.at(block)[...].set(False)
    mask = tc.at(mask)["encoder"].set(True)
    masked = tc.tree_mask(block, mask)
    assert tc.is_frozen(masked.encoder.weight) and tc.is_frozen(masked.encoder.bias)
    assert not tc.is_frozen(masked.decoder.weight)


# ------------------------------------------------------------------------------------------
# laws
# ------------------------------------------------------------------------------------------

_scalars = st.one_of(
    st.integers(-5, 5),
    st.floats(-2, 2, allow_nan=False),
    st.booleans(),
    st.sampled_from(["relu", "tanh", ""]),
    st.none(),
    st.builds(lambda n, f: np.arange(n, dtype=np.float32) * f, st.integers(0, 3), st.floats(-1, 1)),
    st.builds(lambda n: jnp.arange(n), st.integers(0, 3)),
)
_trees = st.recursive(
    _scalars,
    lambda kids: st.one_of(
        st.lists(kids, max_size=3),
        st.lists(kids, max_size=3).map(tuple),
        st.dictionaries(st.sampled_from("abcd"), kids, max_size=3),
        st.builds(lambda w, b: Linear(w, b), kids, kids),
    ),
    max_leaves=8,
)


@st.composite
def _trees_and_masks(draw):
    tree = draw(_trees)
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    flags = draw(st.lists(st.booleans(), min_size=len(leaves), max_size=len(leaves)))
    return tree, treedef.unflatten(flags)


@settings(max_examples=40, deadline=None)
@given(_trees_and_masks())
def test_tree_unmask_inverts_tree_mask_with_a_mask_tree(tree_and_mask):
    tree, mask = tree_and_mask
    assert tc.is_tree_equal(tc.tree_unmask(tc.tree_mask(tree, mask)), tree)


@settings(max_examples=40, deadline=None)
@given(_trees)
def test_tree_unmask_inverts_tree_mask_with_the_default_predicate(tree):
    assert tc.is_tree_equal(tc.tree_unmask(tc.tree_mask(tree)), tree)


@settings(max_examples=40, deadline=None)
@given(_trees_and_masks())
def test_frozen_leaf_never_appears_in_tree_leaves(tree_and_mask):
    tree, mask = tree_and_mask
    leaves = jax.tree_util.tree_leaves(tc.tree_mask(tree, mask))
    assert not any(tc.is_frozen(x) for x in leaves)
    assert len(leaves) == sum(not f for f in jax.tree_util.tree_leaves(mask))


@settings(max_examples=30, deadline=None)
@given(_trees)
def test_freeze_is_equal_for_equal_trees_built_twice(tree):
    rebuilt = pickle.loads(pickle.dumps(tree))
    assert tc.freeze(tree) == tc.freeze(rebuilt)
    assert hash(tc.freeze(tree)) == hash(tc.freeze(rebuilt))


@settings(max_examples=30, deadline=None)
@given(_trees)
def test_freeze_unfreeze_round_trip_keeps_the_value(tree):
    # a snapshot: containers are rebuilt (so later changes to them cannot reach the
    # frozen value), everything else is the very object
    back = tc.unfreeze(tc.freeze(tree))
    assert tc.is_tree_equal(back, tree)
    if not jax.tree_util.tree_leaves(tree) and jax.tree_util.tree_structure(tree).num_nodes == 1:
        assert back is tree


@pytest.mark.parametrize(
    "name", ["freeze", "unfreeze", "is_frozen", "is_nondiff", "tree_mask", "tree_unmask"]
)
def test_docstring_example_runs(name):
    doc = getattr(tc, name).__doc__
    code = doc.split("```python\n")[1].split("```")[0]
    exec(compile(textwrap.dedent(code), f"<{name} docstring>", "exec"), {})


# -- mask rules (`tree_mask.def_type`) must mask ----------------------------------------------


def _rule_types(result):
    class Token:
        def __init__(self, name):
            self.name = name

    def leave_as_is(token):
        return result(token)

    tc.tree_mask.def_type(Token)(leave_as_is)
    return Token


@pytest.mark.parametrize(
    "result",
    [lambda t: t, lambda t: (t, 1), lambda t: t.name, lambda t: jnp.ones(2), lambda t: None],
    ids=["itself", "a-tuple", "a-string", "an-array", "none"],
)
@pytest.mark.parametrize("how", ["predicate", "mask-tree"])
def test_a_mask_rule_returning_an_unmasked_value_names_the_rule_and_leaf(result, how):
    token_type = _rule_types(result)
    tree = {"a": 1.0, "b": [2.0, token_type("t")]}
    cond = (
        (lambda x: isinstance(x, token_type))
        if how == "predicate"
        else {"a": False, "b": [False, True]}
    )
    with pytest.raises(TypeError, match=r"(?s)mask rule for `Token`.*leave_as_is.*\['b'\]\[1\]"):
        tc.tree_mask(tree, cond=cond)
    assert type(tree["b"][1]) is token_type  # the input is as it was


def test_a_mask_rule_result_is_described_once_by_the_value_describer():
    token_type = _rule_types(lambda t: jnp.ones(2))
    with pytest.raises(TypeError, match=r"returned an array f32\[2\] for the leaf at"):
        tc.tree_mask([token_type("t")], mask=[True])
    with pytest.raises(TypeError, match=r"expects a type, got 3 \(an `int`\)"):
        tc.tree_mask.def_type(3)


@pytest.mark.parametrize("fn", [tc.tree_mask, tc.tree_unmask])
def test_an_error_raised_by_the_predicate_gets_a_note_naming_the_leaf(fn):
    def cond(x):
        if x == 2:
            raise ZeroDivisionError("boom")
        return False

    tree = {"a": tc.freeze(1), "b": [tc.freeze(2)]}
    tree = tree if fn is tc.tree_unmask else tc.tree_unmask(tree)
    with pytest.raises(ZeroDivisionError) as info:
        fn(tree, cond=cond)
    notes = getattr(info.value, "__notes__", [])
    assert any("predicate at" in n and "tree['b'][0]" in n for n in notes), notes


def test_a_mask_rule_returning_a_frozen_value_or_a_registered_wrapper_masks():
    class Token:
        pass

    class Hidden:
        def __init__(self, token):
            self.token = token

    tc.tree_mask.def_type(Token)(Hidden)
    tc.tree_unmask.def_type(Hidden)(lambda hidden: hidden.token)
    token = Token()
    masked = tc.tree_mask([token, 1.0], cond=lambda x: isinstance(x, Token))
    assert type(masked[0]) is Hidden and tc.tree_unmask(masked)[0] is token

    class Other:
        pass

    tc.tree_mask.def_type(Other)(tc.freeze)
    other = Other()
    assert tc.is_frozen(tc.tree_mask([other], mask=[True])[0])


def test_a_mask_rule_is_the_mask_part_of_the_type_row_and_covers_subclasses():
    from treeclass import _structure

    class Token:
        pass

    class Special(Token):
        pass

    tc.tree_mask.def_type(Token)(tc.freeze)
    assert _structure.registered_kind(Token).mask is tc.freeze
    assert _structure.registered_kind(Special) is None
    masked = tc.tree_mask([Special()], mask=[True])
    assert tc.is_frozen(masked[0]) and type(tc.unfreeze(masked[0])) is Special
