"""treeclass.optim: masks and labels from selections, their checks, and optax training."""

from __future__ import annotations

import importlib.util
import pathlib
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import Linear
from hypothesis import given, settings
from hypothesis import strategies as st

import treeclass as tc
from treeclass import optim

optax = pytest.importorskip("optax")

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "docs" / "examples"


class MLP(tc.TreeClass):
    def __init__(self, sizes=(2, 3, 1)):
        self.layers = tuple(
            Linear(jnp.full((i, o), 0.5), jnp.zeros(o)) for i, o in zip(sizes[:-1], sizes[1:])
        )

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def flags(tree):
    return [(jax.tree_util.keystr(path), leaf) for path, leaf in jax.tree.leaves_with_path(tree)]


def same_bits(a, b):
    leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(leaves_a) == len(leaves_b) and all(
        np.asarray(x).tobytes() == np.asarray(y).tobytes() for x, y in zip(leaves_a, leaves_b)
    )


def ones_like(tree):
    return jax.tree.map(jnp.ones_like, tree)


# --------------------------------------------------------------------------------------
# mask


def test_mask_is_true_exactly_at_the_selected_leaves():
    model = MLP()
    assert flags(optim.mask(model.at[Linear]["weight"])) == [
        (".layers[0].weight", True),
        (".layers[0].bias", False),
        (".layers[1].weight", True),
        (".layers[1].bias", False),
    ]


def test_mask_has_the_structure_of_the_tree_and_python_bool_leaves():
    model = MLP()
    m = optim.mask(model.at[Linear]["bias"])
    assert jax.tree.structure(m) == jax.tree.structure(model)
    assert all(type(leaf) is bool for leaf in jax.tree.leaves(m))


def test_mask_of_tree_and_selectors_equals_mask_of_indexer():
    model = MLP()
    assert optim.mask(model, Linear, "weight") == optim.mask(model.at[Linear]["weight"])
    assert optim.mask(model, "layers", 1) == optim.mask(tc.at(model)["layers"][1])


def test_mask_of_indexer_with_more_selectors_chains_them():
    model = MLP()
    assert optim.mask(model.at["layers"], 0, "bias") == optim.mask(model.at["layers"][0]["bias"])


def test_mask_works_on_plain_pytrees():
    params = {"w": jnp.ones(2), "b": [jnp.zeros(1), 3.0]}
    assert optim.mask(tc.at(params)["b"]) == {"w": False, "b": [True, True]}


def test_mask_of_bare_tree_without_selectors_raises():
    with pytest.raises(TypeError, match=r"takes an `.at` selection.*tc.optim.mask\(tree, \.\.\.\)"):
        optim.mask(MLP())


def test_mask_of_ellipsis_selects_every_leaf():
    assert all(jax.tree.leaves(optim.mask(MLP(), ...)))


def test_mask_holds_false_for_frozen_values_and_fits_the_params():
    model = MLP().at["layers"][0].apply(tc.freeze)
    m = optim.mask(model.at[Linear]["weight"])
    assert [leaf for _, leaf in flags(m)] == [False, False, True, False]
    assert m.layers[0].weight is False
    assert optim.check_mask(m, model) is m


def test_mask_leaves_the_input_tree_unchanged():
    model = MLP()
    before = jax.tree.leaves(model)
    optim.mask(model.at[Linear]["weight"])
    assert all(a is b for a, b in zip(before, jax.tree.leaves(model)))


# --------------------------------------------------------------------------------------
# check_mask / check_labels


def test_check_mask_returns_the_mask_itself():
    model = MLP()
    m = optim.mask(model.at[Linear]["weight"])
    assert optim.check_mask(m, model) is m


def test_check_mask_accepts_a_prefix_mask():
    params = {"enc": {"w": jnp.ones(2), "b": jnp.ones(2)}, "head": jnp.ones(1)}
    assert optim.check_mask({"enc": False, "head": True}, params) == {"enc": False, "head": True}
    assert optim.check_mask(True, params) is True


def test_check_mask_accepts_scalar_bool_arrays():
    params = {"w": jnp.ones(2), "b": jnp.ones(2)}
    optim.check_mask({"w": jnp.array(True), "b": np.bool_(False)}, params)


def test_check_mask_names_missing_keys_with_the_key_path():
    params = {"enc": {"w": jnp.ones(2), "b": jnp.ones(2)}}
    expected = r"(?s)at `tree\['enc'\]`.*missing in the mask: \['b'\]"
    with pytest.raises(ValueError, match=expected):
        optim.check_mask({"enc": {"w": True}}, params)


def test_check_mask_names_the_node_types_that_differ():
    layers = MLP().layers
    mask_tree = (optim.mask(layers[0], ...), {"weight": True, "bias": True})
    expected = r"at `tree\[1\]`: the parameters have a `Linear`.*the mask has a `dict`"
    with pytest.raises(ValueError, match=expected):
        optim.check_mask(mask_tree, layers)


def test_check_mask_rejects_a_subtree_where_the_params_have_a_leaf():
    expected = r"at `tree\['w'\]`: the parameters have a leaf.*the mask has a `dict`"
    with pytest.raises(ValueError, match=expected):
        optim.check_mask({"w": {"a": True}}, {"w": jnp.ones(2)})


def test_check_mask_rejects_non_bool_leaves_naming_the_key_path():
    model = MLP()
    expected = r"mask leaf at `MLP.layers\[0\].bias` is an array f32"
    with pytest.raises(TypeError, match=expected):
        optim.check_mask(model.at[Linear]["weight"].set(True), model)


def test_check_mask_rejects_bool_arrays_that_are_not_scalars():
    expected = r"mask leaf at `tree\['w'\]` is an array bool\[2\]"
    with pytest.raises(TypeError, match=expected):
        optim.check_mask({"w": jnp.ones(2, bool)}, {"w": jnp.ones(2)})


def test_a_mask_made_after_freezing_fits_the_unfrozen_params_leaving_them_unselected():
    model = MLP()
    frozen = model.at["layers"][0]["bias"].apply(tc.freeze)
    m = optim.mask(frozen.at[Linear]["weight"])
    assert optim.check_mask(m, model) is m and m.layers[0].bias is False


def test_mask_made_before_freezing_still_fits_as_a_prefix():
    model = MLP()
    m = optim.mask(model.at[Linear]["weight"])
    frozen = model.at["layers"][0].apply(tc.freeze)
    assert optim.check_mask(m, frozen) is m


def test_check_labels_accepts_labels_and_plain_label_trees():
    params = {"w": jnp.ones(2), "b": jnp.ones(2)}
    plain = {"w": "a", "b": "b"}
    assert optim.check_labels(plain, params, {"a": 0, "b": 0}) is plain
    wrapped = optim.Labels(plain)
    assert optim.check_labels(wrapped, params) is wrapped


def test_check_labels_names_a_label_without_transform():
    params = {"w": jnp.ones(2), "b": jnp.ones(2)}
    with pytest.raises(ValueError, match=r"label 'sgd' at `tree\['b'\]` has no transform"):
        optim.check_labels({"w": "adam", "b": "sgd"}, params, {"adam": None})


def test_check_labels_rejects_unhashable_labels():
    expected = r"label at `tree\['w'\]` is an array f64\[2\], which is not hashable"
    with pytest.raises(TypeError, match=expected):
        optim.check_labels({"w": np.ones(2)}, {"w": jnp.ones(2)})


def test_check_labels_names_the_key_path_of_a_structure_mismatch():
    with pytest.raises(ValueError, match=r"label tree does not fit the parameters at `tree`"):
        optim.check_labels({"w": "a"}, {"w": jnp.ones(2), "b": jnp.ones(2)})


# --------------------------------------------------------------------------------------
# labels


def test_labels_label_each_selection_and_the_rest_by_default():
    model = MLP()
    lab = optim.labels(model, {"w": model.at[Linear]["weight"]}, default="rest")
    assert [leaf for _, leaf in flags(lab.tree)] == ["w", "rest", "w", "rest"]


def test_labels_accept_selectors_for_the_tree_as_well_as_indexers():
    model = MLP()
    by_indexer = optim.labels(model, {"first": model.at["layers"][0]})
    assert [leaf for _, leaf in flags(by_indexer.tree)] == ["first", "first", "rest", "rest"]
    by_name = optim.labels(model, {"all": "layers"})
    assert set(jax.tree.leaves(by_name.tree)) == {"all"}
    by_type = optim.labels(model, {"linear": Linear}, default=None)
    assert set(jax.tree.leaves(by_type.tree)) == {"linear"}


def test_labels_reject_overlapping_selections_naming_the_paths_claimed_twice():
    model = MLP()
    with pytest.raises(ValueError, match=r"1 leaf\(s\) are claimed") as info:
        optim.labels(model, {"first": model.at["layers"][0], "w": model.at[Linear]["weight"]})
    message = str(info.value)
    assert "`MLP.layers[0].weight`: 'first', 'w'" in message
    assert "`tree.layers[1].weight`" not in message and "`tree.layers[0].bias`" not in message


def test_labels_with_default_none_reject_unclaimed_leaves():
    model = MLP()
    with pytest.raises(ValueError, match=r"2 leaf\(s\) are not:\n    `MLP.layers\[0\].bias`"):
        optim.labels(model, {"w": model.at[Linear]["weight"]}, default=None)


def test_labels_reject_a_selection_made_on_another_tree():
    model, other = MLP(), MLP((2, 1))
    with pytest.raises(ValueError, match=r"selection for label 'w' was made on another tree"):
        optim.labels(model, {"w": other.at[Linear]["weight"]})


def test_labels_skip_frozen_leaves():
    model = MLP().at["layers"][0].apply(tc.freeze)
    lab = optim.labels(model, {"w": model.at[Linear]["weight"]}, default="b")
    assert jax.tree.leaves(lab.tree) == ["w", "b"]
    assert tc.is_frozen(lab.tree.layers[0].weight)


def test_labels_object_returns_its_tree_and_checks_the_params():
    model = MLP()
    lab = optim.labels(model, {"w": model.at[Linear]["weight"]})
    assert lab(model) is lab.tree
    expected = r"label tree does not fit the parameters at `MLP.layers`"
    with pytest.raises(ValueError, match=expected):
        lab(MLP((2, 1)))


def test_labels_repr_and_equality():
    a, b = optim.Labels({"w": "x"}), optim.Labels({"w": "x"})
    assert a == b and a != optim.Labels({"w": "y"})
    assert repr(a) == "Labels({'w': 'x'})"


# --------------------------------------------------------------------------------------
# optax: masks and labels in the transforms that take them


def test_mask_with_optax_masked_on_a_callable_model():
    model = MLP()
    assert callable(model)  # optax must not take the mask tree for a mask function
    opt = optax.masked(optax.scale(-1.0), optim.mask(model.at[Linear]["weight"]))
    updates, _ = opt.update(ones_like(model), opt.init(model), model)
    assert updates.layers[0].weight[0, 0] == -1.0 and updates.layers[0].bias[0] == 1.0
    assert updates.layers[1].weight[0, 0] == -1.0 and updates.layers[1].bias[0] == 1.0


def test_mask_in_adamw_decays_only_the_selected_leaves():
    model = MLP()
    opt = optax.adamw(0.1, weight_decay=0.5, mask=optim.mask(model.at[Linear]["weight"]))
    zeros = jax.tree.map(jnp.zeros_like, model)
    updates, _ = opt.update(zeros, opt.init(model), model)
    # zero gradients: only the decay term moves a leaf (-lr * wd * param)
    assert jnp.allclose(updates.layers[0].weight, -0.1 * 0.5 * 0.5)
    model = model.at[Linear]["bias"].set(1.0)
    updates, _ = opt.update(zeros, opt.init(model), model)
    assert jnp.all(updates.layers[0].bias == 0.0) and jnp.all(updates.layers[1].bias == 0.0)


def test_labels_in_multi_transform_on_a_callable_model():
    model = MLP()
    lab = optim.labels(model, {"w": model.at[Linear]["weight"]}, default="b")
    opt = optax.multi_transform({"w": optax.scale(2.0), "b": optax.scale(3.0)}, lab)
    updates, _ = opt.update(ones_like(model), opt.init(model), model)
    assert [float(leaf.ravel()[0]) for leaf in jax.tree.leaves(updates)] == [2.0, 3.0, 2.0, 3.0]


def test_labels_in_multi_transform_under_jit():
    model = MLP()
    lab = optim.labels(model, {"w": model.at[Linear]["weight"]}, default="b")
    opt = optax.multi_transform({"w": optax.adam(0.1), "b": optax.sgd(0.01)}, lab)

    @jax.jit
    def step(model, state):
        updates, state = opt.update(ones_like(model), state, model)
        return optax.apply_updates(model, updates), state

    new, _ = step(model, opt.init(model))
    assert jnp.allclose(new.layers[0].weight, 0.4) and jnp.allclose(new.layers[0].bias, -0.01)


def test_multi_transform_with_labels_that_do_not_fit_names_the_key_path():
    model = MLP()
    lab = optim.labels(model, {"w": model.at[Linear]["weight"]})
    opt = optax.multi_transform({"w": optax.sgd(1.0), "rest": optax.sgd(1.0)}, lab)
    expected = r"at `MLP.layers`: the parameters have a `tuple`.*the label tree has a `tuple`"
    with pytest.raises(ValueError, match=expected):
        opt.init(MLP((2, 4, 3, 1)))


def test_mask_in_optax_freeze_zeroes_the_selected_updates():
    model = MLP()
    opt = optax.freeze(optim.mask(model.at["layers"][0]))
    updates, _ = opt.update(ones_like(model), opt.init(model), model)
    assert [float(leaf.sum()) for leaf in jax.tree.leaves(updates)] == [0.0, 0.0, 3.0, 1.0]


def test_mask_in_selective_transform_trains_only_the_unselected_leaves():
    model = MLP()
    opt = optax.selective_transform(
        optax.sgd(1.0), freeze_mask=optim.mask(model.at[Linear]["bias"])
    )
    state = opt.init(model)
    updates, _ = opt.update(ones_like(model), state, model)
    assert [float(leaf.sum()) for leaf in jax.tree.leaves(updates)] == [-6.0, 0.0, -3.0, 0.0]


def test_masks_in_a_chain():
    model = MLP()
    weights = optim.mask(model.at[Linear]["weight"])
    biases = optim.mask(model.at[Linear]["bias"])
    opt = optax.chain(
        optax.masked(optax.scale(10.0), weights),
        optax.masked(optax.scale(-1.0), biases),
    )
    updates, _ = opt.update(ones_like(model), opt.init(model), model)
    assert [float(leaf.ravel()[0]) for leaf in jax.tree.leaves(updates)] == [10.0, -1.0] * 2


def _is_masked_node(x):
    return isinstance(x, optax.MaskedNode)


def _plus_one(p):
    return p if _is_masked_node(p) else p + 1


def test_masks_with_optax_tree_utils():
    model = MLP()
    weights = optim.mask(model.at[Linear]["weight"])
    assert optax.tree_utils.tree_sum(weights) == 2  # selected leaves
    opt = optax.masked(optax.adam(1e-3), weights)
    state = opt.init(model)
    mu = optax.tree_utils.tree_get(state, "mu")
    assert [jnp.shape(x) for x in jax.tree.leaves(mu)] == [(2, 3), (3, 1)]
    shifted = optax.tree_utils.tree_map_params(opt, _plus_one, state, is_leaf=_is_masked_node)
    assert jax.tree.leaves(optax.tree_utils.tree_get(shifted, "mu"))[0][0, 0] == 1.0


def test_labels_with_optax_tree_map_params():
    model = MLP()
    lab = optim.labels(model, {"w": model.at[Linear]["weight"]})
    opt = optax.multi_transform({"w": optax.adam(1e-3), "rest": optax.sgd(1e-3)}, lab)
    state = opt.init(model)
    mapped = optax.tree_utils.tree_map_params(opt, _plus_one, state, is_leaf=_is_masked_node)
    mu = optax.tree_utils.tree_get(mapped, "mu")
    assert [float(x.ravel()[0]) for x in jax.tree.leaves(mu)] == [1.0, 1.0]


# --------------------------------------------------------------------------------------
# freezing: optax sees only the unfrozen leaves


def test_optimizer_state_has_no_entries_for_frozen_leaves():
    model = MLP().at["layers"][0].apply(tc.freeze)
    state = optax.adam(1e-3).init(model)
    mu, nu = state[0].mu, state[0].nu
    assert [jnp.shape(x) for x in jax.tree.leaves(mu)] == [(3, 1), (1,)]
    assert [jnp.shape(x) for x in jax.tree.leaves(nu)] == [(3, 1), (1,)]
    assert tc.is_frozen(mu.layers[0].weight) and tc.is_frozen(mu.layers[0].bias)


def test_frozen_leaves_stay_bit_identical_through_training():
    model = MLP().at["layers"][0]["weight"].apply(tc.freeze)
    before = tc.unfreeze(model.layers[0].weight)
    opt = optax.adamw(0.1, weight_decay=0.1)
    state = opt.init(model)

    @jax.jit
    def step(model, state):
        grads = jax.grad(lambda m: jnp.sum(tc.tree_unmask(m)(jnp.ones((4, 2))) ** 2))(model)
        updates, state = opt.update(grads, state, model)
        return optax.apply_updates(model, updates), state

    for _ in range(3):
        model, state = step(model, state)
    assert tc.is_frozen(model.layers[0].weight)
    assert np.asarray(tc.unfreeze(model.layers[0].weight)).tobytes() == np.asarray(before).tobytes()
    assert not jnp.allclose(model.layers[1].weight, 0.5)


def test_masked_non_array_leaves_need_no_special_handling():
    class Layer(tc.TreeClass):
        weight: jax.Array
        activation: object
        name: str
        depth: int

    model = tc.tree_mask(Layer(jnp.ones(2), jnp.tanh, "dense", 3))
    opt = optax.adam(0.1)
    state = opt.init(model)
    grads = jax.grad(lambda m: jnp.sum(tc.unfreeze(m.activation)(m.weight)))(model)
    updates, state = opt.update(grads, state, model)
    new = tc.tree_unmask(optax.apply_updates(model, updates))
    assert new.activation is jnp.tanh and new.name == "dense" and new.depth == 3
    assert jnp.allclose(new.weight, 0.9)


# --------------------------------------------------------------------------------------
# partition


def test_partition_builds_a_multi_transform_in_one_call():
    model = MLP()
    opt = optim.partition(
        {"w": optax.scale(2.0), "rest": optax.scale(0.0)}, model, {"w": model.at[Linear]["weight"]}
    )
    updates, _ = opt.update(ones_like(model), opt.init(model), model)
    assert [float(leaf.ravel()[0]) for leaf in jax.tree.leaves(updates)] == [2.0, 0.0] * 2


def test_partition_names_a_leaf_whose_label_has_no_transform():
    model = MLP()
    expected = r"label 'rest' at `MLP.layers\[0\].bias` has no transform"
    with pytest.raises(ValueError, match=expected):
        optim.partition({"w": optax.sgd(1.0)}, model, {"w": model.at[Linear]["weight"]})


def test_partition_without_optax_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "optax", None)
    model = MLP()
    with pytest.raises(ImportError, match=r"(?s)pip install optax.*treeclass\[optax\]"):
        optim.partition({}, model, {})


def test_optim_imports_without_optax():
    code = (
        "import sys; sys.modules['optax'] = None\n"
        "import treeclass.optim as o\n"
        "import jax.numpy as jnp\n"
        "assert o.check_mask({'a': True}, {'a': jnp.ones(1)}) == {'a': True}\n"
    )
    import subprocess

    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


# --------------------------------------------------------------------------------------
# properties

_names = st.lists(st.sampled_from("abcdefgh"), min_size=1, max_size=8, unique=True)


@settings(max_examples=30, deadline=None)
@given(_names, st.data())
def test_mask_selects_exactly_the_named_keys(names, data):
    params = {name: jnp.full(i + 1, float(i)) for i, name in enumerate(names)}
    chosen = data.draw(st.lists(st.sampled_from(names), unique=True))
    m = optim.mask(tc.at(params)[tuple(chosen)]) if chosen else {n: False for n in names}
    assert m == {name: name in chosen for name in names}


@settings(max_examples=30, deadline=None)
@given(_names, st.data())
def test_labels_of_disjoint_selections_label_each_leaf_once(names, data):
    params = {name: jnp.zeros(2) for name in names}
    groups = data.draw(
        st.lists(st.sampled_from(["x", "y", "z"]), min_size=len(names), max_size=len(names))
    )
    selections = {
        g: tc.at(params)[tuple(n for n, h in zip(names, groups) if h == g)] for g in set(groups)
    }
    lab = optim.labels(params, selections, default=None)
    assert lab.tree == dict(zip(names, groups))
    optim.check_labels(lab, params, set(groups))


@settings(max_examples=30, deadline=None)
@given(
    st.recursive(
        st.booleans(),
        lambda c: st.dictionaries(st.sampled_from("abc"), c, min_size=1, max_size=3),
        max_leaves=8,
    )
)
def test_every_prefix_of_a_fitting_mask_fits(mask_tree):
    params = jax.tree.map(lambda _: jnp.ones(1), mask_tree)

    def prefixes(tree):
        yield True
        if isinstance(tree, dict):
            for key in tree:
                for sub in prefixes(tree[key]):
                    yield {**tree, key: sub}

    for prefix in prefixes(mask_tree):
        optim.check_mask(prefix, params)


# --------------------------------------------------------------------------------------
# the documented examples


def _example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_example_mlp_per_leaf_decays_weights_slows_biases_and_freezes_a_layer():
    example = _example("mlp_per_leaf")
    figures = example.main()
    losses = figures["losses"]
    assert losses[-1] < 0.2 * losses[0]
    assert figures["frozen_layer_unchanged"]
    assert figures["first_weight_step"] == pytest.approx(example.WEIGHT_LR, rel=1e-2)
    assert figures["first_bias_step"] == pytest.approx(example.BIAS_LR, rel=1e-2)
    assert figures["trainable_leaves"] == 4  # the frozen first layer is not a leaf
    assert figures["resumed_losses_identical"]  # saved and loaded halfway through


def test_example_fine_tuning_trains_the_head_then_everything():
    figures = _example("fine_tuning").main()
    assert figures["pretrain_losses"][-1] < 0.1 * figures["pretrain_losses"][0]
    assert figures["head_losses"][-1] < 0.5 * figures["head_losses"][0]
    assert figures["fine_tune_losses"][-1] < 0.5 * figures["head_losses"][-1]
    assert figures["encoder_unchanged_in_phase_1"]
    assert figures["encoder_changed_in_phase_2"]
    assert figures["phase_1_state_mu_leaves"] == figures["head_leaves"] == 2
    assert figures["phase_1_state_nu_leaves"] == 2


def test_example_treeclass_and_dict_params_train_identically():
    figures = _example("treeclass_vs_dict").main()
    assert figures["treeclass_losses"] == figures["dict_losses"]
    assert figures["dict_losses"][-1] < 0.5 * figures["dict_losses"][0]
    assert figures["final_params_identical"]


# --------------------------------------------------------------------------------------
# selections that are not plain: element masks, frozen-only, mistakes


def test_mask_rejects_an_element_mask_that_picks_part_of_a_leaf():
    params = {"w": jnp.ones(2), "b": jnp.ones(3)}
    with pytest.raises(ValueError, match=r"boolean array at `mask\['w'\]` .* picks some elements"):
        optim.mask(tc.at(params)[{"w": jnp.array([True, False]), "b": False}])


def test_mask_accepts_boolean_arrays_that_select_whole_leaves():
    params = {"w": jnp.ones(2), "b": jnp.ones(3), "c": jnp.ones(1)}
    selector = {"w": jnp.array(True), "b": np.ones(3, bool), "c": jnp.zeros(1, bool)}
    assert optim.mask(tc.at(params)[selector]) == {"w": True, "b": True, "c": False}


def test_mask_of_a_selection_reaching_only_frozen_values_is_an_error_unless_not_strict():
    model = MLP().at[Linear]["weight"].apply(tc.freeze)
    with pytest.raises(
        ValueError,
        match=r"(?s)selects only leaves that no optimizer trains.*"
        r"`MLP\.layers\[1\]\.weight` \(frozen by `tc\.freeze`\)",
    ):
        optim.mask(model.at[Linear]["weight"])
    m = optim.mask(model.at[Linear]["weight"], strict=False)
    assert jax.tree.leaves(m) == [False, False, False, False]
    assert m.layers[1].weight is False


def test_empty_mask_or_predicate_selection_is_an_error_for_optimizers():
    model = MLP()
    nothing = jax.tree.map(lambda _: False, model)
    with pytest.raises(ValueError, match="selects no leaf"):
        optim.mask(model.at[nothing])
    with pytest.raises(ValueError, match="selects no leaf"):
        optim.mask(model, tc.where(lambda path, node: False))
    with pytest.raises(LookupError, match=r"did you mean '\*\*\.weight'"):
        optim.mask(model, tc.glob("**.wieght"))
    assert not any(jax.tree.leaves(optim.mask(model.at[nothing], strict=False)))


def test_label_selecting_nothing_is_an_error_unless_not_strict():
    model = MLP()
    with pytest.raises(ValueError, match="selection for label 'decay' selects no leaf"):
        optim.labels(model, {"decay": tc.where(lambda path, node: False)})
    labels = optim.labels(model, {"decay": tc.where(lambda path, node: False)}, strict=False)
    assert set(jax.tree.leaves(labels.tree)) == {"rest"}


def test_strict_must_be_a_bool_and_the_error_describes_what_was_given():
    params = {"w": jnp.ones(2)}
    calls = {
        "mask": lambda: optim.mask(params, ..., strict="no"),
        "labels": lambda: optim.labels(params, {"a": "w"}, strict="no"),
        "trainable": lambda: optim.trainable(optax.sgd(1.0), params, strict="no"),
        "split": lambda: optim.split(params, strict="no"),
    }
    for name, call in calls.items():
        with pytest.raises(
            TypeError, match=rf"`tc.optim.{name}` takes `strict` as a bool, got 'no' \(a `str`\)"
        ):
            call()


def test_labels_need_a_mapping_of_selections():
    with pytest.raises(TypeError, match="mapping of label -> selection.*got 3 \\(an `int`\\)"):
        optim.labels(MLP(), 3)


def test_mask_passes_on_the_indexer_error_for_a_missing_key():
    with pytest.raises(LookupError, match=r"'wieght' not found at \w+\.layers\[0\]; did you mean"):
        optim.mask(MLP().at[Linear]["wieght"])


def test_mask_of_a_predicate_selection():
    model = MLP()
    m = optim.mask(model.at[tc.where(lambda path, x: getattr(x, "ndim", 0) == 1)])
    assert [leaf for _, leaf in flags(m)] == [False, True, False, True]


def test_labels_accept_a_mask_tree_as_selection_on_a_frozen_model():
    model = MLP().at["layers"][0].apply(tc.freeze)
    weights = optim.mask(model.at[Linear]["weight"])
    lab = optim.labels(model, {"w": weights, "b": model.at[Linear]["bias"]}, default=None)
    assert jax.tree.leaves(lab.tree) == ["w", "b"]


# --------------------------------------------------------------------------------------
# the docstring examples run


def _docstring_blocks():
    import re

    blocks = []
    for name in optim.__all__:
        doc = getattr(optim, name).__doc__ or ""
        for i, block in enumerate(re.findall(r"```python\n(.*?)```", doc, re.DOTALL)):
            blocks.append(pytest.param(block, id=f"{name}-{i}"))
    return blocks


@pytest.mark.parametrize("code", _docstring_blocks())
def test_docstring_example_runs(code):
    import textwrap

    exec(compile(textwrap.dedent(code), "<docstring>", "exec"), {})


# --------------------------------------------------------------------------------------
# trainable


class Norm(tc.TreeClass):
    mean: jax.Array = tc.field(metadata={"role": "state"})

    def __init__(self):
        self.scale = jnp.ones(2)
        self.mean = jnp.zeros(2)
        self.eps = 1e-5
        self.steps = jnp.zeros((), jnp.int32)
        self.act = tc.freeze(jnp.ones(3))


def test_trainable_updates_exactly_the_trainable_leaves():
    model = Norm()
    opt = optim.trainable(optax.sgd(1.0), model)
    grads = jax.grad(lambda m: (m.scale + m.mean).sum() + m.eps, allow_int=True)(model)
    updates, _ = opt.update(grads, opt.init(model), model)
    new = optax.apply_updates(model, updates)
    assert not same_bits(new.scale, model.scale)
    assert same_bits([new.mean, new.steps], [model.mean, model.steps]) and new.eps == 1e-5
    assert new.steps.dtype == jnp.int32 and tc.is_frozen(new.act)


def test_trainable_inner_transform_sees_only_the_selected_leaves():
    model = MLP()
    seen = []

    def spy(updates, state, params=None):
        seen.append(jax.tree.leaves(updates))
        return updates, state

    opt = optim.trainable(optax.GradientTransformation(lambda p: (), spy), model.at[Linear]["bias"])
    assert opt.init(model) == ()
    opt.update(ones_like(model), (), model)
    assert [x.shape for x in seen[0]] == [(3,), (1,)]


def test_trainable_takes_a_tree_and_selectors_like_mask():
    model = MLP()
    a = optim.trainable(optax.adam(1e-3), model, Linear, "weight").init(model)
    b = optim.trainable(optax.adam(1e-3), model.at[Linear]["weight"]).init(model)
    assert jax.tree.structure(a) == jax.tree.structure(b)
    assert len(jax.tree.leaves(a[0].mu)) == 2


def test_trainable_composes_with_a_decay_mask_function():
    model = MLP()
    decay = optax.adamw(0.1, weight_decay=1.0, mask=lambda p: optim.mask(p.at[Linear]["weight"]))
    opt = optim.trainable(decay, model)
    zero = jax.tree.map(jnp.zeros_like, model)
    updates, _ = opt.update(zero, opt.init(model), model)
    assert float(jnp.abs(updates.layers[0].weight).max()) > 0  # decayed
    assert float(jnp.abs(updates.layers[0].bias).max()) == 0  # not decayed


def test_trainable_without_a_trainable_leaf_is_an_error():
    with pytest.raises(ValueError, match=r"has no trainable leaf.*roles: 1 frozen, 2 other"):
        optim.trainable(optax.sgd(1.0), {"n": 1.0, "i": jnp.arange(2), "f": tc.freeze(1.0)})
    opt = optim.trainable(optax.identity(), {"n": 1.0}, strict=False)
    assert opt.init({"n": 1.0}) == optax.EmptyState()


def test_trainable_refuses_a_selected_leaf_that_has_no_gradient():
    with pytest.raises(ValueError, match=r"`tree\['i'\]`, an array i32\[2\], which cannot be"):
        optim.trainable(optax.sgd(1.0), {"i": jnp.arange(2), "w": jnp.ones(1)}, "i")


def test_trainable_refuses_a_first_argument_that_is_not_a_transformation():
    with pytest.raises(TypeError, match="takes an optax transformation first"):
        optim.trainable(MLP(), optax.adam(1e-3))


def test_trainable_names_where_a_tree_does_not_fit_its_model():
    opt = optim.trainable(optax.adam(1e-3), MLP())
    with pytest.raises(ValueError, match=r"does not fit the model .* at `MLP\.layers`"):
        opt.init(MLP((2, 3, 3, 1)))


def test_trainable_needs_the_parameters_for_an_integer_leaf_gradient():
    model = {"w": jnp.ones(2), "n": jnp.zeros((), jnp.int32)}
    opt = optim.trainable(optax.sgd(1.0), model)
    grads = jax.grad(lambda m: m["w"].sum(), allow_int=True)(model)
    with pytest.raises(ValueError, match=r"update at `tree\['n'\]` has dtype float0"):
        opt.update(grads, opt.init(model), None)
    updates, _ = opt.update(grads, opt.init(model), model)
    assert updates["n"].dtype == jnp.int32


def test_trainable_selection_is_fixed_when_built_not_when_jitted():
    # under jit a Python number is a traced array; the selection was made before
    model = {"w": jnp.ones(2), "eps": 1e-5}
    opt = optim.trainable(optax.sgd(1.0), model)

    @jax.jit
    def step(model, state):
        grads = jax.tree.map(jnp.ones_like, model)
        updates, state = opt.update(grads, state, model)
        return optax.apply_updates(model, updates), state

    new, _ = step(model, opt.init(model))
    assert new["eps"] == 1e-5 and float(new["w"][0]) == 0.0


class Mixed(tc.TreeClass):
    """A model with a leaf of every kind `trainable` must tell apart."""

    def __init__(self):
        self.layers = (
            Linear(jnp.full((2, 3), 0.5), jnp.zeros(3)),
            Linear(jnp.full((3, 1), 0.5), jnp.zeros(1)),
        )
        self.scale = np.ones(2, np.float32)  # a NumPy array: trainable
        self.table = np.arange(3)  # a NumPy integer array: kept
        self.phase = jnp.ones(2, jnp.complex64)  # complex: trainable
        self.flags = jnp.array([True, False])
        self.steps = jnp.zeros((), jnp.int32)
        self.eps = 1e-5
        self.frozen = tc.freeze({"w": jnp.ones((2, 2)), "n": 2})  # a frozen subtree


def _step(opt, model, state=None, grads=None):
    """One update with all-ones gradients (float0 for integer leaves); returns the new model."""
    state = opt.init(model) if state is None else state
    if grads is None:
        grads = jax.tree.map(
            lambda x: (
                np.zeros(np.shape(x), jax.dtypes.float0)
                if not jnp.issubdtype(jnp.result_type(x), jnp.inexact)
                else jnp.ones_like(x)
            ),
            model,
        )
    updates, state = opt.update(grads, state, model)
    return optax.apply_updates(model, updates), state


def _changed(new, old):
    """The key paths of the leaves whose bits changed (frozen values counted as leaves).

    An old leaf is compared as JAX holds it (`optax.apply_updates` gives every leaf back
    as a JAX array: a Python float as float32, a NumPy int64 array as int32).
    """
    pairs = zip(
        jax.tree_util.tree_leaves_with_path(new, is_leaf=tc.is_frozen),
        jax.tree.leaves(old, is_leaf=tc.is_frozen),
        strict=True,
    )
    changed = []
    for (path, a), b in pairs:
        if tc.is_frozen(a) or tc.is_frozen(b):
            kept = tc.is_frozen(a) and tc.is_frozen(b) and tc.is_tree_equal(a, b)
        else:
            a, b = np.asarray(a), np.asarray(jnp.asarray(b))
            kept = a.dtype == b.dtype and a.tobytes() == b.tobytes()
        if not kept:
            changed.append(jax.tree_util.keystr(path))
    return changed


def test_trainable_updates_the_inexact_arrays_of_every_kind_and_keeps_the_rest():
    model = Mixed()
    new, _ = _step(optim.trainable(optax.sgd(0.1), model), model)
    assert _changed(new, model) == [
        ".layers[0].weight",
        ".layers[0].bias",
        ".layers[1].weight",
        ".layers[1].bias",
        ".scale",
        ".phase",
    ]
    assert new.steps.dtype == jnp.int32 and new.flags.dtype == jnp.bool_
    assert new.table.tolist() == [0, 1, 2] and new.eps == 1e-5
    assert tc.is_frozen(new.frozen)


_LAYERS = [".layers[0].weight", ".layers[0].bias", ".layers[1].weight", ".layers[1].bias"]
_SELECTIONS = {
    "name": (("layers",), _LAYERS),
    "index": (("layers", 1, "weight"), [".layers[1].weight"]),
    "glob": ((tc.glob("layers.*.bias"),), [".layers[0].bias", ".layers[1].bias"]),
    "regex": ((re.compile("sc.*|ph.*"),), [".scale", ".phase"]),
    "class": ((Linear, "weight"), [".layers[0].weight", ".layers[1].weight"]),
    "bool mask": (
        (jax.tree.map(lambda x: jnp.result_type(x) == jnp.complex64, Mixed()),),
        [".phase"],
    ),
    "where": (
        (tc.where(lambda path, x: isinstance(x, jax.Array) and x.ndim == 2),),
        [".layers[0].weight", ".layers[1].weight"],
    ),
    "union": ((("scale", Linear),), [*_LAYERS, ".scale"]),
    "a selected Python float": (("eps",), [".eps"]),
}


@pytest.mark.parametrize("kind", list(_SELECTIONS))
def test_trainable_updates_exactly_a_selection_of_every_selector_kind(kind):
    model = Mixed()
    where, expected = _SELECTIONS[kind]
    new, _ = _step(optim.trainable(optax.sgd(0.1), model, *where), model)
    assert _changed(new, model) == expected
    indexer = tc.at(model)  # the same selection, as an `.at` selection
    for selector in where:
        indexer = indexer[selector]
    again, _ = _step(optim.trainable(optax.sgd(0.1), indexer), model)
    assert same_bits(again, new)


def test_trainable_class_selection_passes_by_a_frozen_instance_of_the_class():
    # LoRA: the frozen base layer is a Linear too
    model = MLP().at["layers"][0].apply(tc.freeze, whole=True)
    opt = optim.trainable(optax.sgd(0.1), model.at[Linear]["weight"])
    new, _ = _step(opt, model)
    assert _changed(new, model) == [".layers[1].weight"]


def _trainable_part(model):
    """The trainable leaves of `Mixed`, in its order: what the inner transform must see."""
    return (model.layers, model.scale, model.phase)


def test_trainable_chain_gives_what_the_chain_gives_on_the_trainable_leaves_alone():
    model = Mixed()
    chain = optax.chain(optax.clip_by_global_norm(0.5), optax.adamw(0.1, weight_decay=0.3))
    opt = optim.trainable(chain, model)
    state = opt.init(model)
    reference = chain.init(_trainable_part(model))
    assert same_bits(state, reference)  # the same state leaves, none for other leaves
    grads = jax.tree.map(
        lambda x: (
            jnp.full_like(x, 2.0)
            if jnp.issubdtype(jnp.result_type(x), jnp.inexact)
            else np.zeros(np.shape(x), jax.dtypes.float0)
        ),
        model,
    )
    for _ in range(3):
        updates, state = opt.update(grads, state, model)
        expected, reference = chain.update(
            _trainable_part(grads), reference, _trainable_part(model)
        )
        assert same_bits(_trainable_part(updates), expected) and same_bits(state, reference)
        model = optax.apply_updates(model, updates)
    assert model.eps == 1e-5 and model.table.tolist() == [0, 1, 2]


def test_trainable_adamw_decays_no_leaf_it_does_not_train():
    model = Mixed().at["steps"].set(jnp.int32(7))
    opt = optim.trainable(optax.adamw(1.0, weight_decay=1.0), model, "layers")
    zeros = jax.tree.map(
        lambda x: (
            jnp.zeros_like(x)
            if jnp.issubdtype(jnp.result_type(x), jnp.inexact)
            else np.zeros(np.shape(x), jax.dtypes.float0)
        ),
        model,
    )
    new, _ = _step(opt, model, grads=zeros)  # zero gradients: only weight decay moves leaves
    assert _changed(new, model) == [".layers[0].weight", ".layers[1].weight"]  # biases are 0


def test_trainable_with_inject_hyperparams_changes_the_learning_rate_in_the_state():
    model = MLP().at["layers"][1]["bias"].apply(tc.freeze)
    opt = optim.trainable(optax.inject_hyperparams(optax.sgd)(learning_rate=0.1), model)
    state = opt.init(model)
    assert float(state.hyperparams["learning_rate"]) == pytest.approx(0.1)

    @jax.jit
    def step(model, state):
        grads = jax.grad(lambda m: jnp.sum(m.layers[0].weight), allow_int=True)(model)
        updates, state = opt.update(grads, state, model)
        return optax.apply_updates(model, updates), state

    moved, state = step(model, state)
    assert float(moved.layers[0].weight[0, 0]) == pytest.approx(0.4)
    assert _changed(moved, model) == [".layers[0].weight"]
    state.hyperparams["learning_rate"] = jnp.asarray(0.0)
    still, _ = step(moved, state)
    assert _changed(still, moved) == []


def test_trainable_leaves_an_unselected_complex_leaf_bit_identical_signed_zeros_included():
    phase = jnp.array([complex(-0.0, 0.0), complex(1.0, -0.0), complex(jnp.nan, jnp.inf)])
    model = {"w": jnp.ones(2), "phase": phase}
    new, _ = _step(optim.trainable(optax.adam(0.1), model, "w"), model)
    assert same_bits(new["phase"], phase) and not same_bits(new["w"], model["w"])


def test_trainable_state_holds_nothing_for_a_frozen_subtree_and_passes_it_through():
    model = Mixed()
    opt = optim.trainable(optax.adam(0.1), model)
    state = opt.init(model)
    assert not [x for x in jax.tree.leaves(state, is_leaf=tc.is_frozen) if tc.is_frozen(x)]
    assert len(jax.tree.leaves(state[0].mu)) == 6  # the four layer leaves, scale, phase
    new, _ = _step(opt, model, state)
    assert tc.is_tree_equal(new.frozen, model.frozen)


def test_trainable_names_a_prng_key_leaf_that_optax_cannot_add_to():
    model = {"w": jnp.ones(2), "key": jax.random.key(0)}
    assert tc.roles(model)["key"] == "other"
    opt = optim.trainable(optax.sgd(0.1), model)
    grads = jax.grad(lambda m: m["w"].sum(), allow_int=True)(model)
    with pytest.raises(TypeError, match=r"(?s)`tree\['key'\]` is a PRNG key.*tc\.freeze"):
        opt.update(grads, opt.init(model), model)
    # a frozen key is no leaf: the optimizer never sees it
    frozen = {"w": jnp.ones(2), "key": tc.freeze(jax.random.key(0))}
    opt = optim.trainable(optax.sgd(0.1), frozen)
    new, _ = _step(opt, frozen, grads=jax.grad(lambda m: m["w"].sum())(frozen))
    assert tc.is_tree_equal(new["key"], frozen["key"]) and float(new["w"][0]) == pytest.approx(0.9)


def test_trainable_refuses_a_selected_prng_key():
    with pytest.raises(ValueError, match=r"`tree\['key'\]`.*cannot be trained"):
        optim.trainable(optax.sgd(1.0), {"key": jax.random.key(0), "w": jnp.ones(1)}, "key")


def test_trainable_built_from_an_abstract_template_trains_as_built_from_the_model():
    # configuration static or frozen: `jax.eval_shape` makes a Python number an abstract
    # array, so build from the model itself when it holds Python numbers
    abstract = jax.eval_shape(Mixed().at["eps"].apply(tc.freeze).replace)
    model = Mixed().at["eps"].apply(tc.freeze)
    assert tc.roles(abstract) == tc.roles(model)
    concrete, _ = _step(optim.trainable(optax.adam(0.1), model), model)
    from_template, _ = _step(optim.trainable(optax.adam(0.1), abstract), model)
    assert same_bits(from_template, concrete)
    opt = optim.trainable(optax.adam(0.1), model)
    assert jax.tree.structure(jax.eval_shape(opt.init, abstract)) == jax.tree.structure(
        opt.init(model)
    )


# --------------------------------------------------------------------------------------
# scale_blocks: a factor per leaf, or per block


def test_scale_blocks_rejects_a_factor_of_the_wrong_shape():
    params = {"w": jnp.ones((3, 2))}
    opt = optim.scale_blocks({"w": jnp.ones(2)})
    with pytest.raises(ValueError, match=re.escape("tree['w']")):
        opt.update(params, opt.init(params))


def test_scale_blocks_scales_each_leaf_by_its_factor_and_a_subtree_by_one_factor():
    model = MLP()
    factors = MLP().at["layers"][0].set(0.5).at["layers"][1]["bias"].set(False)
    factors = factors.at["layers"][1]["weight"].set(jnp.array([0.0, 1.0, 2.0]))
    opt = optax.chain(optax.sgd(1.0), optim.scale_blocks(factors))
    updates, _ = opt.update(ones_like(model), opt.init(model), model)
    assert updates.layers[0].weight.tolist() == [[-0.5] * 3] * 2
    assert updates.layers[1].weight[:, 0].tolist() == [-0.0, -1.0, -2.0]
    assert updates.layers[1].bias.tolist() == [0.0]
    params = {"enc": {"w": jnp.ones(2), "b": jnp.ones(1)}, "head": jnp.ones(3)}
    prefix = optax.chain(optax.sgd(1.0), optim.scale_blocks({"enc": 0.0, "head": 2.0}))
    updates, _ = prefix.update(params, prefix.init(params), params)
    assert jax.tree.map(lambda x: x.tolist(), updates) == {
        "enc": {"w": [0.0, 0.0], "b": [0.0]},
        "head": [-2.0] * 3,
    }


def test_scale_blocks_factors_built_with_set_add_no_model_sized_constant_to_the_step():
    # `.set(1.0)` fills each array leaf: the factors are arrays of the model's shapes,
    # which scale_blocks reduces to one number per leaf or one per block
    params = {"blocks": tc.Stacked({"w": jnp.ones((4, 128, 128))}), "b": jnp.ones(128)}
    factors = tc.at(tc.at(params)[...].set(1.0))["blocks"][0:2].set(0.0)
    assert factors["blocks"].tree["w"].shape == (4, 128, 128)
    opt = optax.chain(optax.sgd(1.0), optim.scale_blocks(factors))
    step = jax.jit(opt.update)
    state = opt.init(params)
    small = jax.jit(
        optax.chain(optax.sgd(1.0), optim.scale_blocks({"blocks": 1.0, "b": 1.0})).update
    )
    assert len(step.lower(params, state).as_text()) < 2 * len(small.lower(params, state).as_text())
    updates, _ = step(params, state)
    assert updates["blocks"].tree["w"][:, 0, 0].tolist() == [0.0, 0.0, -1.0, -1.0]
    assert updates["b"].tolist() == [-1.0] * 128
    uneven = {"w": jnp.ones((2, 3)).at[1, 2].set(0.5)}  # not constant in a row: kept whole
    opt = optim.scale_blocks(uneven)
    updates, _ = opt.update({"w": jnp.ones((2, 3))}, opt.init(uneven))
    assert updates["w"].tolist() == [[1.0, 1.0, 1.0], [1.0, 1.0, 0.5]]


def test_scale_blocks_inside_trainable_on_a_model_with_frozen_values_and_numbers():
    model = {"blocks": tc.Stacked({"w": jnp.ones((3, 2))}), "eps": 1e-5, "f": tc.freeze(1.0)}
    factors = tc.at(tc.at(model)[...].set(1.0))["blocks"][0].set(0.0)  # keeps `f` frozen
    opt = optim.trainable(optax.chain(optax.sgd(1.0), optim.scale_blocks(factors)), model)
    updates, _ = opt.update(ones_like(model), opt.init(model), model)
    assert updates["blocks"].tree["w"][:, 0].tolist() == [0.0, -1.0, -1.0]
    new = optax.apply_updates(model, updates)
    assert new["eps"] == 1e-5 and tc.is_tree_equal(new["f"], model["f"])


# --------------------------------------------------------------------------------------
# the helpers compose: masks and labels (objects and functions), frozen values, stacks


def _frozen_mlp():
    return MLP((2, 3, 3, 1)).at["layers"][0].apply(tc.freeze)


def _weights(tree):
    return optim.mask(tc.at(tree)[Linear]["weight"])


def _label_fn(tree):
    return optim.labels(tree, {"w": tc.at(tree)[Linear]["weight"]}, default="b")


_TRANSFORMS = {"w": optax.sgd(1.0), "b": optax.sgd(0.5)}

COMPOSED = {
    "partition": lambda m: optim.partition(
        _TRANSFORMS, m, {"w": m.at[Linear]["weight"]}, default="b"
    ),
    "labels object": lambda m: optax.multi_transform(_TRANSFORMS, _label_fn(m)),
    "labels function": lambda m: optax.multi_transform(_TRANSFORMS, _label_fn),
    "mask object": lambda m: optax.masked(optax.sgd(1.0), _weights(m)),
    "mask function": lambda m: optax.masked(optax.sgd(1.0), _weights),
    "decay mask object": lambda m: optax.adamw(1.0, weight_decay=0.5, mask=_weights(m)),
    "decay mask function": lambda m: optax.adamw(1.0, weight_decay=0.5, mask=_weights),
}


@pytest.mark.parametrize("wrapped", [True, False], ids=["in trainable", "plain optax"])
@pytest.mark.parametrize("name", list(COMPOSED))
def test_masks_and_labels_compose_with_frozen_values_in_and_out_of_trainable(name, wrapped):
    model = _frozen_mlp()
    opt = COMPOSED[name](model)
    if wrapped:
        opt = optim.trainable(opt, model)
    state = opt.init(model)
    updates, state = opt.update(ones_like(model), state, model)
    new = optax.apply_updates(model, updates)
    assert tc.is_tree_equal(new.layers[0], model.layers[0])  # frozen: untouched
    assert not same_bits(new.layers[1].weight, model.layers[1].weight)
    if wrapped:  # no state for frozen values
        frozen_in_state = [
            x for x in jax.tree.leaves(state, is_leaf=tc.is_frozen) if tc.is_frozen(x)
        ]
        assert not frozen_in_state


def test_labels_returned_by_a_function_are_read_as_a_label_tree():
    model = MLP()
    labels = _label_fn(model)
    assert sorted(set(jax.tree.leaves(labels))) == ["b", "w"]
    assert jax.tree.map(lambda x: x == "w", labels) == jax.tree.map(lambda x: x == "w", labels.tree)


def test_labels_with_an_unknown_label_from_a_function_still_name_the_labels():
    model = MLP()
    opt = optax.multi_transform({"w": optax.sgd(1.0)}, _label_fn)
    with pytest.raises(ValueError, match="no corresponding transformation"):
        opt.init(model)


def test_trainable_with_scale_blocks_on_a_stacked_model_with_a_frozen_block_leaf():
    blocks = tc.Stacked.from_blocks(
        [{"w": jnp.ones((2, 2)), "table": tc.freeze(jnp.ones(3))} for _ in range(3)]
    )
    model = {"blocks": blocks, "head": jnp.ones(2)}
    factors = tc.at(tc.at(model)[...].set(1.0))["blocks"][0].set(0.0)
    opt = optim.trainable(optax.chain(optax.sgd(1.0), optim.scale_blocks(factors)), model)
    updates, _ = opt.update(ones_like(model), opt.init(model), model)
    new = optim.apply_updates(model, updates)
    assert new["blocks"].tree["w"][:, 0, 0].tolist() == [1.0, 0.0, 0.0]
    assert new["head"].tolist() == [0.0, 0.0]
    assert tc.is_frozen(new["blocks"].tree["table"])


# --------------------------------------------------------------------------------------
# an optimizer built before the model changed its frozen values


def test_optimizer_built_before_freezing_refuses_init_naming_the_leaf():
    model = MLP()
    opt = optim.trainable(optax.adam(1e-3), model)
    frozen = model.at["layers"][0]["weight"].apply(tc.freeze)
    with pytest.raises(ValueError, match=r"(?s)`MLP\.layers\[0\]\.weight`.*frozen.*after freezing"):
        opt.init(frozen)


def test_optimizer_built_before_freezing_refuses_update_naming_the_leaf():
    model = MLP()
    opt = optim.trainable(optax.adam(1e-3), model)
    state = opt.init(model)
    frozen = model.at["layers"][0]["weight"].apply(tc.freeze)
    with pytest.raises(ValueError, match=r"`MLP\.layers\[0\]\.weight`"):
        opt.update(ones_like(frozen), state, frozen)


def test_optimizer_built_on_a_frozen_model_refuses_the_thawed_model():
    frozen = MLP().at["layers"][0]["weight"].apply(tc.freeze)
    opt = optim.trainable(optax.adam(1e-3), frozen)
    thawed = frozen.at["layers"][0]["weight"].apply(tc.unfreeze, is_leaf=tc.is_frozen)
    with pytest.raises(ValueError, match=r"(?s)`MLP\.layers\[0\]\.weight`.*not frozen"):
        opt.init(thawed)


# --------------------------------------------------------------------------------------
# every leaf not trained comes back exactly as it was

_SNAN = np.array([0x7F800001], np.uint32).view(np.float32)[0]

LEAF_KINDS = {
    "numpy float64 scalar": lambda: np.float64(0.1),
    "numpy int64 scalar": lambda: np.int64(2**40),
    "python float": lambda: 1e-5,
    "python int": lambda: 7,
    "weak f32 array": lambda: jnp.asarray(1e-5),
    "signalling nan": lambda: jnp.asarray(_SNAN),
    "negative zero": lambda: jnp.asarray(-0.0),
    "int8 array": lambda: jnp.arange(3, dtype=jnp.int8),
    "bool array": lambda: jnp.array([True, False]),
    "numpy f32 array": lambda: np.full(2, np.inf, np.float32),
    "bfloat16 array": lambda: jnp.ones(2, jnp.bfloat16),
}


def _aval(x):
    return (type(x), np.shape(x), np.asarray(x).dtype, bool(getattr(x, "weak_type", False)))


class Holder(tc.TreeClass):
    kept: object = tc.field(role="state")

    def __init__(self, kept):
        self.w = jnp.ones(2)
        self.kept = kept


def _grads(model):
    return jax.tree.map(
        lambda x: (
            np.zeros(np.shape(x), jax.dtypes.float0)
            if not jnp.issubdtype(jnp.result_type(x), jnp.inexact)
            else jnp.ones_like(x)
        ),
        model,
    )


@settings(max_examples=25, deadline=None)
@given(st.lists(st.sampled_from(sorted(LEAF_KINDS)), min_size=1, max_size=4))
def test_apply_updates_returns_every_leaf_not_trained_exactly_as_it_was(kinds):
    model = Holder(tuple(LEAF_KINDS[kind]() for kind in kinds))
    opt = optim.trainable(optax.adamw(0.1, weight_decay=0.5), model)
    updates, _ = opt.update(_grads(model), opt.init(model), model)
    new = optim.apply_updates(model, updates)
    for before, after in zip(model.kept, new.kept, strict=True):
        assert after is before
    assert not same_bits(new.w, model.w)


@pytest.mark.parametrize("kind", ["weak f32 array", "signalling nan", "negative zero"])
def test_jitted_step_keeps_every_leaf_not_trained_with_its_aval_and_bits(kind):
    model = Holder((LEAF_KINDS[kind](),))
    opt = optim.trainable(optax.adamw(0.1, weight_decay=0.5), model)
    traces = []

    @jax.jit
    def step(model, state):
        traces.append(1)
        updates, state = opt.update(_grads(model), state, model)
        return optim.apply_updates(model, updates), state

    state = opt.init(model)
    new, state = step(model, state)
    new, state = step(new, state)
    before, after = model.kept[0], new.kept[0]
    assert _aval(after)[1:] == _aval(before)[1:]
    assert np.asarray(after).tobytes() == np.asarray(before).tobytes()
    assert len(traces) == 1  # the second step reuses the first compilation


# the documented path (`trainable`, `opt.update`, `tc.optim.apply_updates`) is exact for
# every leaf it does not train: same type, shape, dtype, weak type and bits

_BITS_SNAN_F16 = np.array([0x7C01], np.uint16).view(np.float16)
EXACT_KINDS = {
    **LEAF_KINDS,
    "numpy signalling nan array": lambda: np.array([_SNAN, -0.0, np.inf], np.float32),
    "numpy float16 signalling nan": lambda: _BITS_SNAN_F16.copy(),
    "numpy float64 subnormal": lambda: np.array([5e-324, -np.inf]),
    "complex64 signed zeros": lambda: jnp.array([complex(-0.0, 0.0), complex(1.0, -0.0)]),
    "uint32 max": lambda: jnp.array([2**32 - 1], jnp.uint32),
    "numpy bool scalar": lambda: np.bool_(True),
    "bfloat16 nan": lambda: jnp.array([np.nan, -0.0], jnp.bfloat16),
    "weak f32 negative zero": lambda: jnp.asarray(-0.0),
    "strong f32 scalar": lambda: jnp.float32(3.0),
}


class Placed(tc.TreeClass):
    """A value in each place a training step must leave alone."""

    state: object = tc.field(role="state")
    frozen: object = tc.field(role="frozen")

    def __init__(self, state, frozen, extra):
        self.w = jnp.ones(2)
        self.state = state
        self.frozen = frozen
        self.extra = extra  # trained when a parameter, unless the selection leaves it out


def _exact(after, before):
    """Same aval (type kind, shape, dtype, weak type) and the same bits."""
    if isinstance(before, (float, int, bool)):  # a Python number stays itself
        return type(after) is type(before) and repr(after) == repr(before)
    a, b = np.asarray(after), np.asarray(before)
    return (
        type(after) is type(before)
        and (a.shape, a.dtype) == (b.shape, b.dtype)
        and getattr(after, "weak_type", None) == getattr(before, "weak_type", None)
        and a.tobytes() == b.tobytes()
    )


_EXACT_TXS = {
    "adamw": lambda: optax.adamw(0.1, weight_decay=0.5),
    "sgd+momentum": lambda: optax.sgd(0.1, momentum=0.9),
}


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(sorted(EXACT_KINDS)),
    st.sampled_from(["state", "frozen", "extra"]),
    st.sampled_from(["model", "ellipsis", "w"]),
    st.sampled_from(sorted(_EXACT_TXS)),
)
def test_documented_step_leaves_every_value_it_does_not_train_exact(kind, place, select, tx):
    # `extra` is a plain leaf: a selection of it trains it (a Python float too), so it is
    # frozen unless it holds the value, and then only `w` is selected
    places = {"state": 0.5, "frozen": 0.5, "extra": tc.freeze(0.5)}
    model = Placed(**{**places, place: EXACT_KINDS[kind]()})
    if place == "extra":
        select = "w"
    selection = {"model": model, "ellipsis": model.at[...], "w": model.at["w"]}[select]
    opt = optim.trainable(_EXACT_TXS[tx](), selection)
    state, new = opt.init(model), model
    for _ in range(2):
        updates, state = opt.update(_grads(new), state, new)
        new = optim.apply_updates(new, updates)
    assert _exact(getattr(new, place), getattr(model, place))
    assert tc.is_tree_equal(new.at["w"].set(0.0), model.at["w"].set(0.0))
    assert not same_bits(new.w, model.w)


@settings(max_examples=8, deadline=None)
@given(st.sampled_from(sorted(EXACT_KINDS)), st.sampled_from(["state", "frozen", "extra"]))
def test_documented_jitted_step_leaves_every_value_it_does_not_train_as_jit_passes_it(kind, place):
    places = {"state": 0.5, "frozen": 0.5, "extra": tc.freeze(0.5)}
    model = Placed(**{**places, place: EXACT_KINDS[kind]()})
    opt = optim.trainable(optax.adamw(0.1, weight_decay=0.5), model.at["w"])
    traces = []

    @jax.jit
    def step(model, state):
        traces.append(1)
        updates, state = opt.update(_grads(model), state, model)
        return optim.apply_updates(model, updates), state

    passed = jax.jit(lambda m: m)(model)  # what any jitted function returns for them
    new, state = step(model, opt.init(model))
    new, _ = step(new, state)
    assert _exact(getattr(new, place), getattr(passed, place))
    assert len(traces) == 1  # the step's output is a valid input: no second compile


def test_optax_apply_updates_keeps_the_bits_of_strong_arrays_not_trained():
    model = Holder((jnp.asarray([-0.0, np.inf, np.nan], jnp.float32), jnp.arange(3)))
    opt = optim.trainable(optax.sgd(1.0), model)
    updates, _ = opt.update(_grads(model), opt.init(model), model)
    new = optax.apply_updates(model, updates)
    assert same_bits(new.kept, model.kept)


# --------------------------------------------------------------------------------------
# a declared role outranks a selection: every tool, every selector kind, every optimizer


class Roled(tc.TreeClass):
    """A leaf of every role, of a shape of its own (so a state leaf's shape tells whose
    copy it is); three `Linear`s, so a class selection reaches all three."""

    head: Linear  # parameters
    base: Linear = tc.field(role="frozen")
    stats: Linear = tc.field(role="state")
    size: int = tc.field(default=3, static=True)

    def __init__(self):
        self.head = Linear(jnp.full((3, 2), 0.5), jnp.asarray([0.1, -0.0]))
        self.base = Linear(jnp.asarray([[-0.0, 2.0, np.nan, np.inf]] * 5), jnp.full(4, -0.0))
        self.stats = Linear(jnp.full((7, 6), 0.25), jnp.zeros(6))
        self.fixed = tc.freeze(jnp.ones((9, 8)))
        self.size = 3


_HEAD = [".head.weight", ".head.bias"]
ROLE_SELECTIONS = {
    "ellipsis": ((...,), _HEAD),
    "class": ((Linear,), _HEAD),
    "glob": ((tc.glob("**.weight"),), [".head.weight"]),
    "name chain": ((("head", "base", "stats"), "weight"), [".head.weight"]),
    "bool mask tree": ((jax.tree.map(lambda _: True, Roled()),), _HEAD),
    "predicate": ((tc.where(lambda path, x: np.ndim(x) == 2),), [".head.weight"]),
}
NEVER_TRAINED_SHAPES = {(5, 4), (4,), (7, 6), (6,), (9, 8)}

# optax's common set, weight decay included (adafactor is left out: its first eager
# steps take seconds to compile, and it adds no case the others do not cover)
OPTIMIZERS = {
    "sgd": lambda: optax.sgd(0.1),
    "sgd+momentum": lambda: optax.sgd(0.1, momentum=0.9, nesterov=True),
    "sgd+decay": lambda: optax.chain(optax.add_decayed_weights(0.5), optax.sgd(0.1)),
    "adam": lambda: optax.adam(0.1),
    "adamw": lambda: optax.adamw(0.1, weight_decay=0.5),
    "lion": lambda: optax.lion(0.1, weight_decay=0.5),
    "rmsprop": lambda: optax.rmsprop(0.1, momentum=0.9),
    "adagrad": lambda: optax.adagrad(0.1),
    "lamb": lambda: optax.lamb(0.1, weight_decay=0.5),
}


def _paths(tree, flag=lambda x: x is True):
    return [jax.tree_util.keystr(p) for p, x in jax.tree.leaves_with_path(tree) if flag(x)]


def _indexer(model, where):
    indexer = tc.at(model)
    for selector in where:
        indexer = indexer[selector]
    return indexer


def _never_trained(model):
    return (model.base, model.stats, model.fixed, model.size)


def _ones_for_every_leaf(model):
    # a gradient for the frozen and state leaves too: what is never trained must not be
    # trained even when handed a gradient
    return jax.tree.map(jnp.ones_like, model)


@pytest.mark.parametrize("kind", list(ROLE_SELECTIONS))
def test_every_optimizer_trains_a_selection_as_optax_trains_its_parameters_alone(kind):
    where, expected = ROLE_SELECTIONS[kind]
    model = Roled()
    alone = [x for p, x in jax.tree.leaves_with_path(model) if jax.tree_util.keystr(p) in expected]
    for name, make in OPTIMIZERS.items():
        tx = make()
        opt = optim.trainable(tx, _indexer(model, where))
        state, reference = opt.init(model), tx.init(alone)
        # no optimizer state for a frozen or state leaf: the state is that of the
        # parameters alone, leaf for leaf
        assert same_bits(state, reference), name
        assert not {np.shape(x) for x in jax.tree.leaves(state)} & NEVER_TRAINED_SHAPES, name
        new, params = model, alone
        for _ in range(2):
            grads = _ones_for_every_leaf(new)
            updates, state = opt.update(grads, state, new)
            new = optim.apply_updates(new, updates)
            want, reference = tx.update([jnp.ones_like(x) for x in params], reference, params)
            params = optax.apply_updates(params, want)
        trained = [
            x for p, x in jax.tree.leaves_with_path(new) if jax.tree_util.keystr(p) in expected
        ]
        assert same_bits(trained, params), name
        assert tc.is_tree_equal(_never_trained(new), _never_trained(model)), name
        assert same_bits(_never_trained(new), _never_trained(model)), name


@pytest.mark.parametrize("kind", list(ROLE_SELECTIONS))
def test_every_tool_answers_the_same_for_a_selection_reaching_every_role(kind):
    where, expected = ROLE_SELECTIONS[kind]
    model = Roled()
    indexer = _indexer(model, where)
    assert _paths(optim.mask(indexer)) == expected
    labels = optim.labels(model, {"picked": indexer}, default="other")
    assert _paths(labels.tree, lambda x: x == "picked") == expected
    assert labels.tree.base.weight == "(frozen)" and labels.tree.stats.bias == "(state)"
    params, rest = optim.split(indexer)
    assert _paths(params, lambda x: x is not None) == expected
    assert tc.is_tree_equal(optim.merge(params, rest), model)
    # partition: the frozen and state leaves get no transform of the user's, no state
    opt = optim.partition(
        {"picked": optax.adamw(0.1, weight_decay=0.5), "other": optax.adam(0.1)},
        model,
        {"picked": indexer},
        default="other",
    )
    state = opt.init(model)
    assert not {np.shape(x) for x in jax.tree.leaves(state)} & NEVER_TRAINED_SHAPES
    updates, state = opt.update(_ones_for_every_leaf(model), state, model)
    new = optim.apply_updates(model, updates)
    assert same_bits(_never_trained(new), _never_trained(model))
    assert _changed(new, model) == _HEAD


NEVER_TRAINED_TARGETS = {
    "frozen field": (("base",), r"`Roled\.base\.weight` \(role 'frozen'\)"),
    "state field": (("stats", "weight"), r"`Roled\.stats\.weight` \(role 'state'\)"),
    "tc.freeze": (("fixed",), r"`Roled\.fixed` \(frozen by `tc\.freeze`\)"),
    "all three": ((("base", "stats", "fixed"),), r"`Roled\.stats\.bias` \(role 'state'\)"),
}
TOOLS = {
    "mask": lambda model, indexer: optim.mask(indexer),
    "labels": lambda model, indexer: optim.labels(model, {"a": indexer}),
    "partition": lambda model, indexer: optim.partition(
        {"a": optax.sgd(1.0)}, model, {"a": indexer}
    ),
    "trainable": lambda model, indexer: optim.trainable(optax.sgd(1.0), indexer),
    "split": lambda model, indexer: optim.split(indexer),
}


@pytest.mark.parametrize("target", list(NEVER_TRAINED_TARGETS))
@pytest.mark.parametrize("tool", list(TOOLS))
def test_a_selection_of_only_frozen_or_state_leaves_is_an_error_naming_them(tool, target):
    where, named = NEVER_TRAINED_TARGETS[target]
    model = Roled()
    with pytest.raises(
        ValueError, match=rf"(?s)selects only leaves that no optimizer trains.*{named}"
    ):
        TOOLS[tool](model, _indexer(model, where))


def test_a_selection_of_only_frozen_leaves_selects_nothing_when_not_strict():
    model = Roled()
    assert not any(jax.tree.leaves(optim.mask(model.at["base"], strict=False)))
    opt = optim.trainable(optax.adam(0.1), model.at["base"], strict=False)
    assert not jax.tree.leaves(opt.init(model)[0].mu)


def test_bare_multi_transform_handed_a_frozen_leaf_refuses_it_and_names_the_fix():
    model = Roled()
    labels = optim.labels(model, {"w": model.at["head"]["weight"]})
    tx = optax.multi_transform({"w": optax.adam(0.1), "rest": optax.sgd(0.1)}, labels)
    named = r"(?s)`Roled\.base\.weight` \(frozen\).*`Roled\.stats\.weight` \(state\)"
    with pytest.raises(ValueError, match=named + r".*tc\.optim\.trainable\(optax\.multi"):
        tx.init(model)
    # wrapped, the transform never sees those leaves: no state for them
    opt = optim.trainable(tx, model)
    state = opt.init(model)
    assert not {np.shape(x) for x in jax.tree.leaves(state)} & NEVER_TRAINED_SHAPES
    new, _ = _step(opt, model, state, _ones_for_every_leaf(model))
    assert _changed(new, model) == _HEAD


def test_partition_inside_trainable_keeps_no_state_for_frozen_or_state_leaves():
    model = Roled()
    opt = optim.trainable(
        optim.partition(
            {"w": optax.adam(0.1), "rest": optax.sgd(0.1)}, model, {"w": tc.glob("**.weight")}
        ),
        model,
    )
    state = opt.init(model)
    assert not {np.shape(x) for x in jax.tree.leaves(state)} & NEVER_TRAINED_SHAPES
    updates, _ = opt.update(_ones_for_every_leaf(model), state, model)
    assert same_bits(_never_trained(optim.apply_updates(model, updates)), _never_trained(model))


def test_partition_refuses_a_transform_under_the_label_it_keeps_for_frozen_leaves():
    model = Roled()
    with pytest.raises(ValueError, match=r"'\(frozen\)'.*Rename those transforms"):
        optim.partition({"(frozen)": optax.sgd(1.0), "rest": optax.sgd(1.0)}, model, {})


def test_check_labels_accepts_the_labels_of_leaves_never_trained():
    model = Roled()
    labels = optim.labels(model, {"w": model.at[Linear]})
    assert optim.check_labels(labels, model, {"w": None, "rest": None}) is labels


def test_optimizer_state_placed_like_the_model_holds_nothing_for_a_frozen_base():
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((1,), ("data",))
    model = jax.device_put(Roled(), NamedSharding(mesh, P()))
    opt = optim.trainable(optax.adamw(0.1, weight_decay=0.5), model.at[...])
    state = tc.init_like(opt.init, model)
    assert {np.shape(x) for x in jax.tree.leaves(state)} == {(), (3, 2), (2,)}
    placed = tc.shardings_like(jax.eval_shape(opt.init, model), model)
    assert len(jax.tree.leaves(placed)) == len(jax.tree.leaves(state))


_ROLED_PATHS = [jax.tree_util.keystr(p) for p, _ in jax.tree.leaves_with_path(Roled())]
_ROLED_ROLES = jax.tree.leaves(tc.roles(Roled()), is_leaf=lambda x: isinstance(x, str))


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.booleans(), min_size=len(_ROLED_PATHS), max_size=len(_ROLED_PATHS)),
    st.sampled_from(["sgd+momentum", "adamw"]),
)
def test_a_mask_selection_trains_exactly_its_parameters(picks, name):
    model = Roled()
    selector = jax.tree.unflatten(jax.tree.structure(model), picks)  # `fixed` stays frozen
    wanted = [
        p
        for p, pick, role in zip(_ROLED_PATHS, picks, _ROLED_ROLES)
        if pick and role == "trainable"
    ]
    if not wanted:
        reached = any(picks)
        with pytest.raises(
            ValueError, match="only leaves that no optimizer" if reached else "selects no leaf"
        ):
            optim.trainable(OPTIMIZERS[name](), model.at[selector])
        return
    tx = OPTIMIZERS[name]()
    opt = optim.trainable(tx, model.at[selector])
    alone = [x for p, x in jax.tree.leaves_with_path(model) if jax.tree_util.keystr(p) in wanted]
    assert same_bits(opt.init(model), tx.init(alone))
    new, _ = _step(opt, model, grads=_ones_for_every_leaf(model))
    assert _changed(new, model) == wanted


# a selection of every kind, drawn at random; the role decides whether a leaf is trained
_SELECTORS = st.one_of(
    st.just(...),
    st.just(Linear),
    st.lists(st.sampled_from(["head", "base", "stats", "fixed"]), min_size=1, unique=True).map(
        tuple
    ),
    st.sampled_from(["**.weight", "**.bias", "**", "*"]).map(tc.glob),
    st.lists(st.booleans(), min_size=len(_ROLED_PATHS), max_size=len(_ROLED_PATHS)).map(
        lambda picks: jax.tree.unflatten(jax.tree.structure(Roled()), picks)
    ),
    st.integers(0, 2).map(lambda ndim: tc.where(lambda path, x: np.ndim(x) == ndim)),
)
_HEAD_ONLY = {".head.weight", ".head.bias"}


@settings(max_examples=20, deadline=None)
@given(_SELECTORS)
def test_no_selection_reaches_a_frozen_or_state_leaf_through_any_tool(selector):
    model = Roled()
    indexer = model.at[selector]
    picked = set(_paths(optim.mask(indexer, strict=False)))
    assert picked <= _HEAD_ONLY
    labels = optim.labels(model, {"a": indexer}, default="b", strict=False)
    assert set(_paths(labels.tree, lambda x: x == "a")) == picked
    params, _ = optim.split(indexer, strict=False)
    assert set(_paths(params, lambda x: x is not None)) == picked
    tools = {
        "trainable": optim.trainable(optax.sgd(1.0), indexer, strict=False),
        "partition": optim.trainable(
            optim.partition(
                {"a": optax.sgd(1.0), "b": optax.set_to_zero()},
                model,
                {"a": indexer},
                default="b",
                strict=False,
            ),
            model,
        ),
    }
    for name, opt in tools.items():
        new, _ = _step(opt, model, grads=_ones_for_every_leaf(model))
        changed = set(_changed(new, model))
        # the partition's other label zeroes its updates, which turns a -0.0 into 0.0
        assert changed == picked if name == "trainable" else picked <= changed <= _HEAD_ONLY
        assert same_bits(_never_trained(new), _never_trained(model)), name


def test_trainable_names_a_refrozen_leaf_of_a_split_gradient_at_the_models_key_path():
    # the gradient holds `None` before the leaf: the path is the model's, not shifted
    class Late(tc.TreeClass):
        base: Linear = tc.field(role="frozen")

        def __init__(self):
            self.base = Linear(jnp.ones((2, 2)), jnp.ones(2))
            self.head = Linear(jnp.ones((2, 1)), jnp.ones(1))

    model = Late()
    opt = optim.trainable(optax.sgd(1.0), model)
    grads, _ = optim.split(model)
    refrozen = grads.at["head"]["bias"].apply(tc.freeze)
    with pytest.raises(ValueError, match=r"(?s)`Late\.head\.bias`.*frozen"):
        opt.update(refrozen, opt.init(model), model)


def test_trainable_steps_an_abstract_model_with_a_split_gradient_as_the_concrete_one():
    model = Roled()
    opt = optim.trainable(optax.adam(0.1), model)
    grads, _ = optim.split(_ones_for_every_leaf(model))
    state = opt.init(model)
    updates, new_state = opt.update(grads, state, model)
    shapes = jax.eval_shape(opt.update, grads, jax.eval_shape(opt.init, model), model)
    assert jax.tree.structure(shapes) == jax.tree.structure((updates, new_state))
    assert updates.base.weight is None and updates.fixed is None
    assert [x.shape for x in jax.tree.leaves(shapes)] == [
        np.shape(x) for x in jax.tree.leaves((updates, new_state))
    ]
