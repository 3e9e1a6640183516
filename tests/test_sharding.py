"""Sharding rules: the check before allocation, the specs, building in place, what follows.

The checks need no devices (an `AbstractMesh` has axis names and sizes only), so they run
here. Placing arrays on 8 devices runs in a subprocess (tests/sharding_multidevice_check.py,
the tests at the end); on 2 processes, in tests/test_multihost.py.
"""

from __future__ import annotations

import os
import re
import tempfile
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import AbstractMesh, NamedSharding
from jax.sharding import PartitionSpec as P
from multidevice import run_check_script

import treeclass as tc

MESH = AbstractMesh((2, 4), ("data", "model"))


class Linear(tc.TreeClass):
    weight: Any
    bias: Any


class Norm(tc.TreeClass):
    scale: Any


class Block(tc.TreeClass):
    def __init__(self, key: jax.Array) -> None:
        k1, k2 = jax.random.split(key)
        self.norm = Norm(jnp.ones(8))
        self.up = Linear(jax.random.normal(k1, (8, 16)), jnp.zeros(16))
        self.down = Linear(jax.random.normal(k2, (16, 8)), jnp.zeros(8))


class Model(tc.TreeClass):
    def __init__(self, key: jax.Array, depth: int = 4) -> None:
        ke, kb = jax.random.split(key)
        self.embed = jax.random.normal(ke, (32, 8))
        self.blocks = tc.Stacked.from_init(Block, jax.random.split(kb, depth))
        self.table = tc.freeze(np.arange(6.0))  # frozen: not a leaf, needs no rule
        self.steps = jnp.zeros((), jnp.int32)  # a scalar: one layout, needs no rule


def abstract(depth: int = 4) -> Model:
    return jax.eval_shape(lambda: Model(jax.random.key(0), depth))


RULES = tc.ShardingRules(
    [
        (tc.glob("embed"), ("vocab", "embed")),
        (tc.glob("blocks.*.up.weight"), ("embed", "mlp")),
        (tc.glob("blocks.*.down.weight"), ("mlp", "embed")),
        (Linear, "bias", P()),
        (Norm, P()),
    ],
    axes={"vocab": None, "embed": "data", "mlp": "model", "layers": None},
    block_axis="layers",
)


def problems(rules: tc.ShardingRules, tree: Any, mesh: Any = MESH) -> str:
    with pytest.raises(ValueError, match="do not fit") as info:
        rules.specs(tree, mesh)
    return str(info.value)


# -- specs ------------------------------------------------------------------------------------


def test_specs_map_logical_names_to_mesh_axes():
    specs = RULES.specs(abstract(), MESH)
    assert specs.embed == P(None, "data")
    assert specs.blocks.tree.up.weight == P(None, "data", "model")
    assert specs.blocks.tree.down.weight == P(None, "model", "data")
    assert specs.blocks.tree.up.bias == P() and specs.blocks.tree.norm.scale == P()


def test_a_deployment_remaps_the_same_table():
    tensor_parallel = RULES.with_axes(embed=None)
    specs = tensor_parallel.specs(abstract(), MESH)
    assert specs.embed == P()
    assert specs.blocks.tree.up.weight == P(None, None, "model")
    assert RULES.specs(abstract(), MESH).embed == P(None, "data")  # the table is unchanged


def test_a_logical_name_maps_to_several_mesh_axes():
    rules = RULES.with_axes(embed=("data", "model"), mlp=None)
    assert rules.specs(abstract(), MESH).embed == P(None, ("data", "model"))


def test_mesh_axis_names_work_without_a_mapping():
    rules = tc.ShardingRules([(tc.glob("w"), ("model", None))])
    assert rules.specs({"w": jnp.ones((4, 2))}, MESH)["w"] == P("model", None)


def test_frozen_values_and_scalars_need_no_rule():
    specs = RULES.specs(abstract(), MESH)
    assert tc.is_frozen(specs.table)  # kept as it is: not a leaf
    assert specs.steps == P()


def test_every_selector_kind_selects():
    tree = {"a": Linear(jnp.ones((4, 8)), jnp.ones(8)), "b": {"c": jnp.ones((8, 4))}}
    rules = tc.ShardingRules(
        [
            (Linear, "weight", ("data", None)),  # a class, then a name: a chain
            (tc.where(lambda path, x: getattr(x, "ndim", 0) == 1), P()),  # a predicate
            ("b", "c", (None, "model")),  # names
        ]
    )
    specs = rules.specs(tree, MESH)
    assert specs["a"].weight == P("data", None) and specs["a"].bias == P()
    assert specs["b"]["c"] == P(None, "model")


def test_a_tuple_of_names_is_their_union():
    tree = {"q": jnp.ones((4, 4)), "k": jnp.ones((4, 4)), "o": jnp.ones((4, 4))}
    rules = tc.ShardingRules([(("q", "k"), ("data", None)), ("o", (None, "data"))])
    specs = rules.specs(tree, MESH)
    assert specs == {"q": P("data", None), "k": P("data", None), "o": P(None, "data")}


def test_specs_of_a_real_model_read_only_its_shapes():
    model = Model(jax.random.key(0))
    assert RULES.specs(model, MESH) == RULES.specs(abstract(), MESH)


# -- the check --------------------------------------------------------------------------------


def test_an_unmatched_leaf_is_an_error_naming_its_path():
    rules = tc.ShardingRules(RULES.table()[:-1], axes=RULES.axes, block_axis="layers")
    text = problems(rules, abstract())
    assert "`Model.blocks.norm.scale` f32[4,8] (stacked: 4 blocks of [8]): no rule matches" in text


def test_unmatched_leaves_are_replicated_when_the_table_says_so():
    rules = tc.ShardingRules(
        RULES.table()[:-1], axes=RULES.axes, block_axis="layers", unmatched="replicate"
    )
    assert rules.specs(abstract(), MESH).blocks.tree.norm.scale == P()


def test_replicated_unmatched_stacked_leaves_keep_the_block_axis_split():
    rules = tc.ShardingRules(
        RULES.table()[:-1], axes=RULES.axes, block_axis="layers", unmatched="replicate"
    ).with_axes(layers="data", embed=None)
    assert rules.specs(abstract(), MESH).blocks.tree.norm.scale == P("data", None)


def test_the_first_rule_that_selects_a_leaf_gives_its_spec():
    # a catch-all after the specific rules: it gives the leaves they leave
    rules = tc.ShardingRules(
        [*RULES.table()[:3], (tc.glob("**"), P())], axes=RULES.axes, block_axis="layers"
    )
    specs = rules.specs(abstract(), MESH)
    assert specs.blocks.tree.up.weight == P(None, "data", "model")
    assert specs.blocks.tree.up.bias == P() and specs.blocks.tree.norm.scale == P()
    # the same rules in the other order: the catch-all takes every leaf first
    text = problems(tc.ShardingRules([(tc.glob("**"), P()), *RULES.table()]), abstract())
    assert "rule 1 (glob('embed') -> P('vocab', 'embed')) selects `Model.embed`" in text


def test_a_rule_whose_every_leaf_an_earlier_rule_took_names_the_rules_that_took_them():
    rules = tc.ShardingRules(
        [*RULES.table(), (tc.glob("**.up.weight"), ("mlp", "embed"))],
        axes=RULES.axes,
        block_axis="layers",
    )
    text = problems(rules, abstract())
    assert "1 problem(s)" in text
    assert (
        "rule 5 (glob('**.up.weight') -> P('mlp', 'embed')) selects `Model.blocks.up.weight`"
        in (text)
    )
    assert "but it is taken by an earlier rule (rule 1 (glob('blocks.*.up.weight')" in text
    # a rule that agrees with the earlier one is no different: it gives nothing
    agreeing = [*RULES.table(), (tc.glob("**.bias"), P())]
    text = problems(tc.ShardingRules(agreeing, axes=RULES.axes, block_axis="layers"), abstract())
    assert "rule 5 (glob('**.bias') -> P()) selects `Model.blocks.up.bias`" in text
    assert "(rule 3 (Linear, 'bias' -> P()))" in text


def test_a_rule_taking_some_leaves_of_its_selection_is_no_error():
    rules = tc.ShardingRules(
        [*RULES.table()[:3], (tc.glob("**.up.*"), P()), (tc.glob("**"), P())],
        axes=RULES.axes,
        block_axis="layers",
    )
    # `**.up.*` selects up's weight (rule 1 took it) and its bias (which it gives)
    specs = rules.specs(abstract(), MESH)
    assert specs.blocks.tree.up.weight == P(None, "data", "model")
    assert specs.blocks.tree.up.bias == P() and specs.embed == P(None, "data")


def test_a_spec_of_another_rank_names_the_path_and_the_shape():
    rules = tc.ShardingRules([(tc.glob("w"), ("data",))])
    text = problems(rules, {"w": jnp.ones((4, 2))})
    assert "`tree['w']` f32[4,2]: rule 0 (glob('w') -> P('data',))" in text
    assert "gives a spec of 1 entries" in text
    assert "one per axis of the leaf (2)" in text


def test_an_empty_spec_replicates_any_rank():
    rules = tc.ShardingRules([(tc.glob("*"), P())])
    assert rules.specs({"w": jnp.ones((4, 2)), "v": jnp.ones(3)}, MESH) == {"w": P(), "v": P()}


def test_an_indivisible_axis_names_path_shape_and_mesh_axis():
    rules = tc.ShardingRules([(tc.glob("w"), (None, "model"))])
    text = problems(rules, {"w": jnp.ones((4, 6))})
    assert "`tree['w']` f32[4,6]" in text
    assert "splits axis 1 (size 6) in 4 over mesh axis 'model'" in text
    assert "6 is not divisible by 4" in text


def test_an_axis_split_over_several_mesh_axes_needs_their_product_to_divide_it():
    rules = tc.ShardingRules([(tc.glob("w"), (("data", "model"), None))])
    text = problems(rules, {"w": jnp.ones((4, 2))})
    assert "in 8 over mesh axes 'data' x 'model' (2 x 4)" in text


def test_an_unknown_axis_name_names_the_rule():
    rules = tc.ShardingRules([(tc.glob("w"), ("embd", None))], axes={})
    text = problems(rules, {"w": jnp.ones((4, 2))})
    assert "rule 0 (glob('w') -> P('embd', None)) uses the axis name 'embd'" in text
    assert "nor an axis of the mesh ('data', 'model')" in text


def test_a_logical_name_mapped_to_no_mesh_axis_is_an_error():
    rules = tc.ShardingRules([(tc.glob("w"), ("embed", None))], axes={"embed": "fsdp"})
    text = problems(rules, {"w": jnp.ones((4, 2))})
    assert "`axes` maps 'embed' to 'fsdp', which is not an axis of the mesh" in text


def test_a_mesh_axis_used_twice_in_one_spec_is_an_error():
    rules = tc.ShardingRules([(tc.glob("w"), ("a", "b"))], axes={"a": "model", "b": "model"})
    text = problems(rules, {"w": jnp.ones((4, 4))})
    assert "`tree['w']` f32[4,4]" in text and "the mesh axis 'model'" in text


def test_a_rule_that_selects_nothing_is_an_error():
    rules = tc.ShardingRules([(tc.glob("w"), P()), (tc.glob("wieght"), P())])
    text = problems(rules, {"w": jnp.ones(2)})
    assert "rule 1 (glob('wieght') -> P()) cannot select in tree" in text


def test_a_predicate_that_selects_nothing_is_an_unused_rule():
    rules = tc.ShardingRules([(tc.glob("w"), P()), (tc.where(lambda p, x: False), P())])
    assert "matches no leaf of tree" in problems(rules, {"w": jnp.ones(2)})


def test_every_problem_is_reported_at_once():
    rules = tc.ShardingRules(
        [(tc.glob("a"), ("model",)), (tc.glob("b"), ("nope",)), (tc.glob("c"), ("x", "y"))]
    )
    text = problems(rules, {"a": jnp.ones(3), "b": jnp.ones(2), "c": jnp.ones(2), "d": jnp.ones(2)})
    # a: 3 in 4 parts; b: an unknown name; c: two unknown names and a rank misfit; d: no rule
    assert "6 problem(s)" in text
    for where in ("`tree['a']`", "'nope'", "'x'", "'y'", "`tree['c']`", "`tree['d']`"):
        assert where in text


def test_a_long_list_of_problems_is_cut_with_a_count():
    tree = {f"w{i}": jnp.ones(2) for i in range(60)}
    text = problems(tc.ShardingRules([(tc.glob("w0"), P())]), tree)
    assert "59 problem(s)" in text and "... and 9 more" in text


def test_the_check_leaves_the_tree_as_it_was():
    tree = {"w": jnp.ones((4, 6))}
    before = jax.tree.leaves(tree)
    problems(tc.ShardingRules([(tc.glob("w"), (None, "model"))]), tree)
    assert jax.tree.leaves(tree)[0] is before[0] and set(tree) == {"w"}


# -- stacked blocks ---------------------------------------------------------------------------


def test_a_stacked_leaf_gets_the_block_axis_first():
    specs = RULES.with_axes(layers="data", embed=None).specs(abstract(), MESH)
    assert specs.blocks.tree.up.weight == P("data", None, "model")


def test_without_a_block_axis_the_blocks_are_not_split():
    rules = tc.ShardingRules(RULES.table(), axes={"embed": "data", "mlp": "model", "vocab": None})
    assert rules.specs(abstract(), MESH).blocks.tree.up.weight == P(None, "data", "model")


def test_a_spec_of_the_stacked_rank_gives_the_block_axis_its_entry():
    rules = tc.ShardingRules([(tc.glob("blocks.*.w"), ("data", None, "model"))])
    tree = {"blocks": tc.Stacked({"w": jnp.ones((2, 4, 4))})}
    assert rules.specs(tree, MESH)["blocks"].tree["w"] == P("data", None, "model")


def test_a_stacked_rank_misfit_says_both_ranks_that_fit():
    rules = tc.ShardingRules([(tc.glob("blocks.*.w"), ("data",))])
    text = problems(rules, {"blocks": tc.Stacked({"w": jnp.ones((2, 4, 4))})})
    assert "(stacked: 2 blocks of [4,4])" in text
    assert "one per axis of a block (2; the block axes get `block_axis`), or 3" in text


def test_a_rule_selecting_some_blocks_only_is_an_error():
    rules = tc.ShardingRules([(tc.glob("blocks.0.w"), P())])
    text = problems(rules, {"blocks": tc.Stacked({"w": jnp.ones((2, 4))})})
    assert "selects some blocks of a stack only, at `tree['blocks']['w']` (blocks [0])" in text


def test_an_indivisible_block_axis_names_the_stacked_leaf():
    text = problems(RULES.with_axes(layers="model"), abstract(depth=2))
    assert "`Model.blocks.up.weight` f32[2,8,16] (stacked: 2 blocks of [8,16])" in text
    assert "splits axis 0 (size 2) in 4 over mesh axis 'model'" in text


def test_nested_stacks_get_one_block_axis_each():
    inner = tc.Stacked({"w": jnp.ones((3, 2, 4))})
    tree = {"outer": tc.Stacked({"inner": inner}, length=3)}
    rules = tc.ShardingRules([(tc.glob("outer.*.inner.*.w"), (None,))], block_axis="data")
    with pytest.raises(ValueError, match="splits axis 0 .size 3. in 2"):
        rules.specs(tree, MESH)


# -- the table itself -------------------------------------------------------------------------


def test_a_mapping_of_a_name_no_rule_uses_is_refused_with_the_closest():
    with pytest.raises(ValueError, match="maps 'mpl', but no rule uses that name") as info:
        RULES.with_axes(mpl="model")
    assert "Did you mean 'mlp'?" in str(info.value)
    with pytest.raises(ValueError, match="no rule uses"):
        tc.ShardingRules([(tc.glob("w"), ("embed",))], axes={"embd": None})


@pytest.mark.parametrize(
    ("row", "match"),
    [
        ("w", "a rule is a tuple of one or more selectors"),
        ((tc.glob("w"),), "a rule is a tuple"),
        ((tc.glob("w"), "embed"), "the last item of a rule is its partition spec"),
        ((tc.glob("w"), ("embed", 3)), "has the entry 3"),
    ],
)
def test_a_malformed_rule_is_refused_at_construction(row, match):
    with pytest.raises(TypeError, match=match):
        tc.ShardingRules([row])


def test_malformed_settings_are_refused():
    with pytest.raises(TypeError, match="`axes` maps logical axis names"):
        tc.ShardingRules([(tc.glob("w"), ("e",))], axes={"e": 3})
    with pytest.raises(ValueError, match="`unmatched` is 'error' or 'replicate'"):
        tc.ShardingRules([], unmatched="ignore")
    with pytest.raises(TypeError, match="`block_axis` is an axis name"):
        tc.ShardingRules([], block_axis=0)


def test_the_table_round_trips_and_prints_its_rules():
    again = tc.ShardingRules(RULES.table(), axes=RULES.axes, block_axis="layers")
    assert again.specs(abstract(), MESH) == RULES.specs(abstract(), MESH)
    assert "rule 4 (Norm -> P())" in repr(RULES)


# -- placing ----------------------------------------------------------------------------------

ONE = jax.make_mesh((1, 1), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)


def test_init_traces_the_constructor_once_and_places_every_leaf():
    calls = []

    def build(key):
        calls.append(key)
        return Model(key)

    model = RULES.init(ONE, build, jax.random.key(0))
    assert len(calls) == 1
    assert model.blocks.tree.up.weight.sharding == NamedSharding(ONE, P(None, "data", "model"))
    expected = Model(jax.random.key(0))
    assert tc.is_tree_equal(model, expected)


def test_init_checks_the_rules_before_running_anything():
    calls = []

    def build(key):
        calls.append(key)
        return {"w": jnp.ones((3, 2))}

    rules = tc.ShardingRules([(tc.glob("v"), P())])
    with pytest.raises(ValueError, match="no rule matches it"):
        rules.init(ONE, build, jax.random.key(0))
    assert len(calls) == 1  # traced, never run


def test_template_carries_the_shardings_and_the_summary_shows_them():
    template = RULES.template(abstract(), MESH)
    assert template.embed.sharding.spec == P(None, "data")
    table = tc.tree_summary(template)
    assert "│ .embed" in table and "P(None, 'data')" in table
    assert "P(None, 'data', 'model')" in table  # a stacked leaf's row


def test_load_into_a_template_of_the_rules():
    model = RULES.init(ONE, Model, jax.random.key(0))
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "model.safetensors")
        tc.save(path, model)
        restored = tc.load(path, RULES.template(abstract(), ONE))
    assert tc.is_tree_equal(restored, model)
    assert restored.embed.sharding == NamedSharding(ONE, P(None, "data"))


def test_shardings_like_follows_key_paths_and_replicates_the_rest():
    model = RULES.init(ONE, Model, jax.random.key(0))
    state = jax.eval_shape(optax.adam(1e-3).init, model)
    placed = tc.shardings_like(state, model)
    assert placed[0].mu.blocks.tree.up.weight.spec == P(None, "data", "model")
    assert placed[0].nu.embed.spec == P(None, "data")
    assert placed[0].count.spec == P()


def test_shardings_like_takes_shardings_or_templates():
    shardings = RULES.shardings(abstract(), ONE)
    template = RULES.template(abstract(), ONE)
    state = jax.eval_shape(optax.sgd(1e-3, momentum=0.9).init, template)
    for like in (shardings, template):
        assert tc.shardings_like(state, like)[0].trace.embed.spec == P(None, "data")


def test_shardings_like_replicates_a_leaf_of_another_shape_at_a_model_path():
    like = {"w": NamedSharding(ONE, P("data", None))}
    model = {"w": jax.device_put(jnp.ones((4, 2)), like["w"])}
    state = {"w": jax.ShapeDtypeStruct((4,), jnp.float32)}  # a factored statistic
    assert tc.shardings_like(state, model)["w"].spec == P()


def test_shardings_like_without_a_mesh_says_how_to_give_one():
    with pytest.raises(ValueError, match="Pass the mesh"):
        tc.shardings_like({"a": jnp.ones(2)}, {"a": np.ones(2)})
    placed = tc.shardings_like({"a": jnp.ones(2)}, {"a": np.ones(2)}, mesh=ONE)
    assert placed["a"].spec == P()


def test_init_like_places_the_trainable_state_like_the_model():
    model = RULES.init(ONE, Model, jax.random.key(0))
    opt = tc.optim.trainable(optax.adamw(1e-3), model)
    state = tc.init_like(opt.init, model)
    leaves = jax.tree_util.tree_flatten_with_path(state)[0]
    by_path = {jax.tree_util.keystr(p): x for p, x in leaves}
    mu = [x for p, x in by_path.items() if p.endswith(".mu.blocks.up.weight")]
    assert mu and mu[0].sharding.spec == P(None, "data", "model")
    assert all(x.sharding.mesh == ONE for x in by_path.values())


# -- a law ------------------------------------------------------------------------------------

_NAMES = ("data", "model", "pipe")


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.tuples(*[st.sampled_from([1, 2, 3, 4])] * 3),
    shape=st.lists(st.sampled_from([1, 2, 3, 4, 6, 8, 12]), min_size=1, max_size=3),
    entries=st.lists(
        st.one_of(st.none(), st.sampled_from(_NAMES), st.sampled_from([("data", "pipe")])),
        min_size=3,
        max_size=3,
    ),
)
def test_the_check_refuses_exactly_the_specs_jax_could_not_place(sizes, shape, entries):
    mesh = AbstractMesh(sizes, _NAMES)
    spec = tuple(entries[: len(shape)])
    rules = tc.ShardingRules([(tc.glob("w"), spec)])
    used = [a for e in spec if e for a in ((e,) if isinstance(e, str) else e)]
    fits = len(used) == len(set(used)) and all(
        n % int(np.prod([sizes[_NAMES.index(a)] for a in ((e,) if isinstance(e, str) else e)])) == 0
        for n, e in zip(shape, spec)
        if e
    )
    tree = {"w": jax.ShapeDtypeStruct(tuple(shape), jnp.float32)}
    if fits:
        assert rules.specs(tree, mesh)["w"] == P(*spec) or not any(spec)
    else:
        with pytest.raises(ValueError, match=re.escape("`tree['w']`")):
            rules.specs(tree, mesh)


# -- 8 devices (in a subprocess) --------------------------------------------------------------


@pytest.fixture(scope="module")
def eight_devices() -> dict:
    return run_check_script("sharding_multidevice_check.py")


@pytest.mark.parametrize(
    "check",
    [
        "eight_devices",
        "page_transformer_fsdp_in_place",
        "page_transformer_tensor_parallel_in_place",
        "no_device_holds_the_whole_model",
        "train_step_keeps_shardings_and_matches_one_device",
        "plain_optax_state_follows_the_model",
        "load_reads_into_the_rules_template",
        "summary_shows_every_leaf_spec",
        "misfit_on_the_real_mesh_is_refused_before_allocation",
    ],
)
def test_on_eight_devices(eight_devices, check):
    assert eight_devices[check] == "ok", eight_devices[check]


# -- heads: a rule must not cut a head across devices -------------------------------------------


def _attention(num_heads=4, num_kv_heads=2):
    def build():
        return tc.nn.MultiHeadAttention(
            16, num_heads, num_kv_heads=num_kv_heads, head_dim=4, key=jax.random.key(0)
        )

    return jax.eval_shape(build)


HEAD_RULES = tc.ShardingRules(
    [
        (tc.glob("q_proj.weight"), ("heads", None)),
        (tc.glob("k_proj.weight"), ("heads", None)),
        (tc.glob("v_proj.weight"), ("heads", None)),
        (tc.glob("o_proj.weight"), (None, "heads")),
    ],
    axes={"heads": "model"},
)


def test_splitting_two_key_value_heads_over_four_devices_names_leaf_count_and_mesh_axis():
    text = problems(HEAD_RULES, _attention())
    assert "`MultiHeadAttention.k_proj.weight` f32[8,16]" in text
    assert "splits axis 0 in 4 over mesh axis 'model'" in text
    assert "cuts its 2 heads (MultiHeadAttention.num_kv_heads=2)" in text
    assert "v_proj" in text and "q_proj" not in text and "o_proj" not in text  # 4 fit in 4
    assert "2 problem(s)" in text
    over_data = HEAD_RULES.with_axes(heads="data")  # 2 devices: one key/value head each
    assert over_data.specs(_attention(), MESH).k_proj.weight == P("data", None)


def test_the_output_projection_holds_its_heads_on_its_input_axis():
    text = problems(HEAD_RULES, _attention(num_heads=2, num_kv_heads=2))
    assert "`MultiHeadAttention.o_proj.weight` f32[16,8]: " in text
    assert "splits axis 1 in 4" in text and "(MultiHeadAttention.num_heads=2)" in text
    out_axis = tc.ShardingRules(
        [(tc.glob("o_proj.weight"), ("heads", None))],
        axes={"heads": "model"},
        unmatched="replicate",
    )
    assert out_axis.specs(_attention(num_heads=2), MESH).o_proj.weight == P("model", None)


def test_stacked_attention_counts_the_heads_axis_after_the_block_axis():
    def build():
        return tc.Stacked.from_init(
            lambda k: {"attn": tc.nn.MultiHeadAttention(16, 4, num_kv_heads=2, key=k)},
            jax.random.split(jax.random.key(0), 3),
        )

    rules = tc.ShardingRules(
        [(tc.glob("*.attn.k_proj.weight"), ("heads", None))],
        axes={"heads": "model"},
        unmatched="replicate",
    )
    text = problems(rules, jax.eval_shape(build))
    assert "(stacked: 3 blocks of [8,16])" in text and "splits axis 1 in 4" in text


def test_a_lora_adapter_s_rank_axis_is_not_a_heads_axis():
    def build():
        attention = tc.nn.MultiHeadAttention(16, 4, num_kv_heads=2, key=jax.random.key(0))
        return attention.at["k_proj"].apply(
            lambda linear: tc.nn.LoRA(linear, 4, key=jax.random.key(1)), whole=True
        )

    model = jax.eval_shape(build)
    rank = tc.ShardingRules(
        [(tc.glob("k_proj.lora_A.weight"), ("heads", None))],
        axes={"heads": "model"},
        unmatched="replicate",
    )
    assert rank.specs(model, MESH).k_proj.lora_A.weight == P("model", None)
    out = tc.ShardingRules(
        [(tc.glob("k_proj.lora_B.weight"), ("heads", None))],
        axes={"heads": "model"},
        unmatched="replicate",
    )
    assert "`MultiHeadAttention.k_proj.lora_B.weight`" in problems(out, model)


def test_any_layer_declares_its_heads_in_field_metadata():
    class Heads(tc.TreeClass):
        table: Any = tc.field(metadata={"axes": ("heads", "dim")})

    class Mine(tc.TreeClass):
        inner: Any = tc.field(metadata={"heads": ("count", "heads")})
        count: int = tc.field(default=6, static=True)

    model = Mine(Heads(jnp.ones((12, 2))))
    rules = tc.ShardingRules([(tc.glob("inner.table"), ("model", None))])
    text = problems(rules, model)
    assert "cuts its 6 heads (Mine.count=6)" in text
    assert rules.specs(model.replace(count=12), MESH).inner.table == P("model", None)
