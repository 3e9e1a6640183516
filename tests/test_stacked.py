"""Stacked blocks (`tc.Stacked`): building, applying with scan, `.at` on blocks, printing,
per-block optimizer settings and converting checkpoints between stacked and unstacked."""

from __future__ import annotations

import copy
import os
import pickle
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import Linear, device_holds
from hypothesis import given, settings
from hypothesis import strategies as st

import treeclass as tc

optax = pytest.importorskip("optax")

WIDTH = 4


class Norm(tc.TreeClass):
    scale: jax.Array
    eps: float = tc.field(default=1e-5, static=True)

    def __call__(self, x):
        return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + self.eps) * self.scale


class Block(tc.TreeClass):
    def __init__(self, key, width=WIDTH):
        k1, k2 = jax.random.split(key)
        self.norm = Norm(jnp.ones(width))
        self.up = Linear(jax.random.normal(k1, (width, width)) / width, jnp.zeros(width))
        self.down = Linear(jax.random.normal(k2, (width, width)) / width, jnp.zeros(width))

    def __call__(self, x):
        return x + self.down(jax.nn.relu(self.up(self.norm(x))))

    def scale_up(self, by):
        self.up = Linear(self.up.weight * by, self.up.bias)
        return by


class StackedNet(tc.TreeClass):
    def __init__(self, key, n=5):
        keys = jax.random.split(key, n)
        self.blocks = tc.Stacked.from_init(Block, keys)
        self.head = Linear(jnp.ones((WIDTH, 1)), jnp.zeros(1))

    def __call__(self, x):
        return self.head(self.blocks(x))


class Net(tc.TreeClass):
    """The same model with a tuple of blocks, applied in a Python loop."""

    def __init__(self, blocks, head):
        self.blocks = tuple(blocks)
        self.head = head

    def __call__(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def stacked_net(n=5):
    return StackedNet(jax.random.key(0), n)


def unstacked(net):
    return Net(net.blocks.unstack(), net.head)


def x_batch():
    return jax.random.normal(jax.random.key(1), (3, WIDTH))


def close(a, b, tol=1e-6):
    return all(
        np.allclose(np.asarray(x), np.asarray(y), atol=tol, rtol=tol)
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


# -- building -------------------------------------------------------------------------------


def test_from_init_traces_the_constructor_once():
    calls = []

    def make(key):
        calls.append(key)
        return Block(key)

    stack = tc.Stacked.from_init(make, jax.random.split(jax.random.key(0), 7))
    assert len(calls) == 1 and len(stack) == 7
    assert stack.tree.up.weight.shape == (7, WIDTH, WIDTH)


def test_from_init_gives_each_block_its_own_key():
    keys = jax.random.split(jax.random.key(0), 3)
    stack = tc.Stacked.from_init(Block, keys)
    for i in range(3):
        assert np.array_equal(stack[i].up.weight, Block(keys[i]).up.weight)


def test_from_init_keeps_values_that_do_not_depend_on_the_key_once():
    make = lambda key: {"w": jax.random.normal(key, (2,)), "act": "relu", "table": np.eye(2)}
    stack = tc.Stacked.from_init(make, jax.random.split(jax.random.key(0), 4))
    assert stack.tree["act"] == "relu"
    assert isinstance(stack.tree["table"], np.ndarray) and stack.tree["table"].shape == (4, 2, 2)


def test_constructor_finds_the_number_of_blocks_from_the_leading_axis():
    stack = tc.Stacked({"w": jnp.zeros((3, 2)), "b": jnp.zeros((3,))})
    assert len(stack) == 3 and stack[0]["w"].shape == (2,)


def test_constructor_rejects_an_array_without_the_block_axis():
    with pytest.raises(ValueError, match=re.escape("blocks['w'] is an array f32[3,2]")):
        tc.Stacked({"w": jnp.zeros((3, 2)), "b": jnp.zeros((2,))})


def test_constructor_needs_a_length_when_there_are_no_arrays():
    with pytest.raises(ValueError, match="length="):
        tc.Stacked({"name": "x"})
    assert len(tc.Stacked({"name": "x"}, length=2)) == 2


def test_a_block_must_be_a_node():
    with pytest.raises(TypeError, match="jnp.stack"):
        tc.Stacked.from_blocks([jnp.ones(2), jnp.ones(2)])


def test_from_blocks_of_nothing_is_an_error():
    with pytest.raises(ValueError, match="at least one block"):
        tc.Stacked.from_blocks([])


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 5), shape=st.lists(st.integers(1, 3), max_size=2))
def test_from_blocks_and_unstack_are_inverses(n, shape):
    rng = np.random.default_rng(n)
    blocks = [
        {"w": np.asarray(rng.standard_normal(shape), np.float32), "k": jnp.int32(i), "name": "b"}
        for i in range(n)
    ]
    stack = tc.Stacked.from_blocks(blocks)
    back = stack.unstack()
    assert len(back) == n
    for got, want in zip(back, blocks):
        assert got["name"] == "b"
        assert np.array_equal(got["w"], want["w"]) and int(got["k"]) == int(want["k"])
    assert tc.is_tree_equal(tc.Stacked.from_blocks(back), stack)


def test_from_blocks_names_the_block_and_path_of_a_shape_that_differs():
    blocks = [Block(jax.random.key(i)) for i in range(3)]
    blocks[2] = blocks[2].at["up"]["bias"].set(jnp.zeros(7))
    with pytest.raises(ValueError, match=re.escape("Block 2's array at blocks[2].up.bias")):
        tc.Stacked.from_blocks(blocks)


def test_from_blocks_names_a_differing_static_field():
    with pytest.raises(ValueError, match=r"blocks\[1\]: block 0 has a `Norm` with other static"):
        tc.Stacked.from_blocks([Norm(jnp.ones(2)), Norm(jnp.ones(2), eps=0.1)])


def test_from_blocks_names_a_leaf_frozen_in_one_block_only():
    blocks = [Norm(jnp.ones(2)), Norm(tc.freeze(jnp.ones(2)))]
    with pytest.raises(ValueError, match=r"frozen in block 1 but not in block 0"):
        tc.Stacked.from_blocks(blocks)


def test_from_blocks_requires_equal_shared_values():
    with pytest.raises(ValueError, match=r"blocks\[1\]\['act'\] is 'gelu'"):
        tc.Stacked.from_blocks(
            [{"w": jnp.ones(1), "act": "relu"}, {"w": jnp.ones(1), "act": "gelu"}]
        )


def test_numbers_that_differ_between_blocks_become_one_per_block():
    stack = tc.Stacked.from_blocks([{"w": jnp.ones(1), "p": 0.1 * i} for i in range(3)])
    assert stack.tree["p"].shape == (3,) and stack.tree["p"].dtype == np.float32
    assert float(stack[2]["p"]) == pytest.approx(0.2)


def test_frozen_arrays_are_stacked_and_stay_frozen():
    stack = tc.Stacked.from_blocks([{"w": tc.freeze(jnp.full(2, float(i)))} for i in range(3)])
    assert tc.is_frozen(stack.tree["w"]) and tc.unfreeze(stack.tree["w"]).shape == (3, 2)
    assert tc.is_frozen(stack[1]["w"]) and tc.unfreeze(stack[1]["w"]).tolist() == [1.0, 1.0]
    assert jax.tree.leaves(stack) == []  # hidden from JAX, as in each block


# -- the blocks -----------------------------------------------------------------------------


def test_len_iteration_and_indexing_give_ordinary_blocks():
    net = stacked_net(4)
    blocks = list(net.blocks)
    assert len(net.blocks) == 4 and len(blocks) == 4
    assert type(blocks[3]) is Block
    assert np.array_equal(net.blocks[-1].up.weight, blocks[3].up.weight)
    assert np.array_equal(net.blocks[1].up.weight, net.blocks.tree.up.weight[1])


def test_index_out_of_range_is_an_index_error():
    with pytest.raises(IndexError, match="valid: -4 to 3"):
        stacked_net(4).blocks[4]


def test_a_slice_of_a_stack_is_a_smaller_stack():
    net = stacked_net(5)
    part = net.blocks[1:4]
    assert isinstance(part, tc.Stacked) and len(part) == 3
    assert np.array_equal(part[0].up.weight, net.blocks[1].up.weight)
    with pytest.raises(IndexError, match="selects no block"):
        net.blocks[4:2]


def test_jax_sees_stacked_arrays_under_the_blocks_key_paths():
    net = stacked_net(3)
    paths = {jax.tree_util.keystr(p): x.shape for p, x in jax.tree_util.tree_leaves_with_path(net)}
    assert paths[".blocks.up.weight"] == (3, WIDTH, WIDTH)
    assert paths[".head.weight"] == (WIDTH, 1)


def test_a_stack_is_immutable():
    stack = stacked_net().blocks
    with pytest.raises(AttributeError, match="immutable"):
        stack._tree = None


def test_pickle_and_copy_keep_the_stack():
    stack = stacked_net(3).blocks
    for other in (pickle.loads(pickle.dumps(stack)), copy.copy(stack), copy.deepcopy(stack)):
        assert isinstance(other, tc.Stacked) and tc.is_tree_equal(other, stack)


# -- applying -------------------------------------------------------------------------------


def test_call_matches_the_unrolled_loop():
    net = stacked_net()
    assert close(net(x_batch()), unstacked(net)(x_batch()))


def test_scan_threads_the_carry_and_stacks_outputs():
    stack = tc.Stacked({"scale": jnp.array([1.0, 2.0, 3.0])})
    carry, seen = stack.scan(lambda block, c: (c * block["scale"], c), jnp.float32(1.0))
    assert float(carry) == 6.0 and seen.tolist() == [1.0, 1.0, 2.0]


def test_scan_hands_each_block_its_slice_of_the_inputs():
    stack = tc.Stacked({"scale": jnp.array([1.0, 2.0, 3.0])})
    xs = jnp.array([10.0, 20.0, 30.0])
    carry, ys = stack.scan(lambda block, c, x: (c + x, block["scale"] * x), 0.0, xs)
    assert float(carry) == 60.0 and ys.tolist() == [10.0, 40.0, 90.0]


def test_gradients_under_jit_match_the_unrolled_model():
    net = stacked_net()
    loss = lambda m: jnp.sum(m(x_batch()) ** 2)
    stacked_grads = jax.jit(jax.grad(loss))(net)
    unrolled_grads = jax.grad(loss)(unstacked(net))
    assert close(tc.unstack_all(stacked_grads), unrolled_grads, tol=1e-5)


@pytest.mark.parametrize("remat", [True, jax.checkpoint_policies.dots_saveable])
def test_remat_gives_the_same_gradients(remat):
    net = stacked_net()

    def loss(m, remat):
        out = m.blocks.scan(lambda b, x: (b(x), None), x_batch(), remat=remat)[0]
        return jnp.sum(m.head(out) ** 2)

    assert close(jax.grad(loss)(net, remat), jax.grad(loss)(net, False), tol=1e-6)


def test_the_block_is_traced_once_however_many_blocks():
    calls = []

    def step(block, x):
        calls.append(1)
        return block(x), None

    jax.jit(lambda s, x: s.scan(step, x)[0])(stacked_net(9).blocks, x_batch())
    assert len(calls) == 1


def test_scan_function_must_return_a_pair():
    with pytest.raises(TypeError, match=r"pair `\(carry, output\)`"):
        stacked_net().blocks.scan(lambda block, x: block(x), x_batch())


def test_frozen_arrays_reach_each_block_frozen_inside_scan():
    stack = tc.Stacked.from_blocks([{"w": tc.freeze(jnp.full(2, float(i)))} for i in range(3)])

    def step(block, carry):
        assert tc.is_frozen(block["w"])
        return carry + tc.unfreeze(block["w"]), None

    assert stack.scan(step, jnp.zeros(2))[0].tolist() == [3.0, 3.0]


def test_jit_of_a_stacked_model_is_cached_across_calls():
    traces = []

    @jax.jit
    def forward(m, x):
        traces.append(1)
        return m(x)

    net = stacked_net()
    forward(net, x_batch())
    forward(net.at["blocks"][1]["up"]["bias"].set(1.0), x_batch())
    assert len(traces) == 1


# -- .at on blocks --------------------------------------------------------------------------


def test_at_get_returns_the_blocks_slice():
    net = stacked_net()
    got = net.at["blocks"][3]["up"]["weight"].get()
    assert np.array_equal(got.blocks[3].up.weight, net.blocks.tree.up.weight[3])
    assert got.blocks[0].up.weight is None and got.head.weight is None


def test_at_get_of_every_block_keeps_the_stack():
    net = stacked_net()
    got = net.at["blocks"][...]["up"]["weight"].get()
    assert isinstance(got.blocks, tc.Stacked)
    assert np.array_equal(got.blocks.tree.up.weight, net.blocks.tree.up.weight)


def test_at_get_with_a_fill_value_keeps_the_stack():
    net = stacked_net()
    got = net.at["blocks"][2]["up"]["bias"].get(fill_value=0.0)
    assert isinstance(got.blocks, tc.Stacked)


def test_at_set_writes_only_that_blocks_slice():
    net = stacked_net()
    new = net.at["blocks"][2]["up"]["weight"].set(0.0)
    weights = new.blocks.tree.up.weight
    assert float(jnp.abs(weights[2]).sum()) == 0.0
    assert np.array_equal(np.delete(weights, 2, 0), np.delete(net.blocks.tree.up.weight, 2, 0))
    assert new.blocks.tree.down.weight is net.blocks.tree.down.weight  # untouched: not copied


def test_at_apply_runs_on_the_block_slice():
    net = stacked_net()
    shapes = []
    net.at["blocks"][1]["norm"]["scale"].apply(lambda s: shapes.append(s.shape) or s)
    assert shapes == [(WIDTH,)]


@pytest.mark.parametrize("selector", [slice(0, 2), (0, 1), slice(None, 2)])
def test_at_slice_or_tuple_selects_several_blocks(selector):
    net = stacked_net(4)
    scales = net.at["blocks"][selector]["norm"]["scale"].set(5.0).blocks.tree.norm.scale
    assert scales[:, 0].tolist() == [5.0, 5.0, 1.0, 1.0]


def test_at_negative_index_counts_from_the_end():
    scales = stacked_net(4).at["blocks"][-1]["norm"]["scale"].set(5.0).blocks.tree.norm.scale
    assert scales[:, 0].tolist() == [1.0, 1.0, 1.0, 5.0]


def test_at_ellipsis_below_the_stack_reaches_every_block():
    net = stacked_net(3)
    new = net.at["blocks"][...]["up"]["bias"].apply(lambda b: b + 1)
    assert np.array_equal(new.blocks.tree.up.bias, net.blocks.tree.up.bias + 1)


def test_at_glob_below_the_block_index():
    net = stacked_net(3)
    new = net.at[tc.glob("blocks.*.up.**")].set(0.0)
    assert float(jnp.abs(new.blocks.tree.up.weight).sum()) == 0.0
    assert np.array_equal(new.blocks.tree.down.weight, net.blocks.tree.down.weight)
    one = net.at[tc.glob("blocks[1].down.bias")].set(1.0).blocks.tree.down.bias
    assert one[:, 0].tolist() == [0.0, 1.0, 0.0]


def test_at_class_selector_reaches_inside_the_blocks():
    net = stacked_net(3)
    new = net.at[Linear]["weight"].apply(lambda w: w * 0)
    assert float(jnp.abs(new.blocks.tree.up.weight).max()) == 0.0
    assert float(jnp.abs(new.head.weight).max()) == 0.0
    assert np.array_equal(new.blocks.tree.up.bias, net.blocks.tree.up.bias)


def test_a_number_set_in_every_block_fills_its_arrays_as_in_the_unstacked_model():
    net = stacked_net(3)
    new = net.at["blocks"][...]["up"]["bias"].set(2.0)
    bias = net.blocks.tree.up.bias
    assert new.blocks.tree.up.bias.shape == bias.shape and (new.blocks.tree.up.bias == 2.0).all()
    assert all(
        (block.up.bias == 2.0).all() and block.up.bias.shape == bias.shape[1:]
        for block in tc.at(unstacked(net))["blocks"][...]["up"]["bias"].set(2.0).blocks
    )


@pytest.mark.parametrize(
    "value",
    [
        np.ones((3, 4), np.float32),  # the whole stacked leaf's shape: not a block's
        np.ones(5, np.float32),  # another shape
        np.ones(4, jnp.bfloat16),  # a block's shape, another dtype
        np.arange(4, dtype=np.float32),  # a block's shape and dtype: fits
    ],
    ids=["stacked shape", "other shape", "other dtype", "fits"],
)
def test_one_array_set_in_every_block_follows_the_block_rule_of_an_index(value):
    # `.at[...]` and every index `.at[0:n]` put one value into each block: both refuse what
    # does not fit a block (naming the leaf) and agree on what does
    net = stacked_net(3)
    routes = {
        "ellipsis": lambda: net.at["blocks"][...]["up"]["bias"].set(jnp.asarray(value)),
        "all indices": lambda: net.at["blocks"][0:3]["up"]["bias"].set(jnp.asarray(value)),
        "one index": lambda: net.at["blocks"][1]["up"]["bias"].set(jnp.asarray(value)),
    }
    before = np.asarray(net.blocks.tree.up.bias).copy()
    fits = value.shape == before.shape[1:] and value.dtype == before.dtype
    outcomes = {}
    for route, put in routes.items():
        if fits:
            outcomes[route] = put().blocks.tree.up.bias
            continue
        with pytest.raises(
            TypeError,
            match=r"at StackedNet\.blocks\[\d\]\.up\.bias: .*a block takes an array of shape \[4\]",
        ):
            put()
        assert np.array_equal(net.blocks.tree.up.bias, before)  # the input is unchanged
    if fits:
        assert np.array_equal(outcomes["ellipsis"], outcomes["all indices"])
        assert np.array_equal(outcomes["ellipsis"], np.broadcast_to(value, before.shape))
        assert np.array_equal(outcomes["one index"][1], value)


def test_a_function_of_each_block_may_still_recast_every_block():
    net = stacked_net(3)
    new = net.at["blocks"][...]["up"]["bias"].apply(lambda b: b.astype(jnp.bfloat16))
    assert new.blocks.tree.up.bias.dtype == jnp.bfloat16
    assert new.blocks.tree.up.bias.shape == net.blocks.tree.up.bias.shape


def test_one_plain_array_set_in_every_block_of_a_frozen_leaf_unfreezes_it_in_all():
    stack = tc.Stacked({"w": tc.freeze(jnp.zeros((3, 2))), "b": jnp.zeros((3, 2))})
    new = stack.at[...]["w"].set(jnp.ones(2), is_leaf=tc.is_frozen)
    assert not tc.is_frozen(new.tree["w"]) and np.array_equal(new.tree["w"], np.ones((3, 2)))
    # some blocks only: refused, naming a block left frozen
    with pytest.raises(ValueError, match=r"frozen in block 0 but not in block 1"):
        stack.at[1:]["w"].set(jnp.ones(2), is_leaf=tc.is_frozen)
    assert tc.is_frozen(stack.tree["w"])  # the input is unchanged


def _below_block_selectors():
    """One selector chain per selector kind, used below a block index (block 1, say)."""
    block = Block(jax.random.key(0))
    return {
        "name": ("up", "weight"),
        "union of names": (("up", "down"), "bias"),
        "ellipsis": (...,),
        "class": (Linear, "weight"),
        "class alone": (Norm,),
        "glob": (tc.glob("up.*"),),
        "glob with **": (tc.glob("**.bias"),),
        "regex": (re.compile("up|down"), "weight"),
        "where": (tc.where(lambda path, x: isinstance(x, jax.Array) and x.ndim == 2),),
        "bool mask": (jax.tree.map(lambda x: x.ndim == 1, block),),
        "element mask": (
            jax.tree.map(lambda x: jnp.arange(x.size).reshape(x.shape) % 2 == 0, block),
        ),
    }


@pytest.mark.parametrize("kind", list(_below_block_selectors()))
@pytest.mark.parametrize("blocks", [1, -1, slice(1, 3), (0, 2), ...], ids=str)
def test_at_below_the_block_index_selects_as_in_the_unstacked_model(kind, blocks):
    net = stacked_net(4)
    where = _below_block_selectors()[kind]
    stacked, plain = net.at["blocks"][blocks], tc.at(unstacked(net))["blocks"][blocks]
    for selector in where:
        stacked, plain = stacked[selector], plain[selector]
    new, expected = stacked.apply(lambda x: -x - 1.0), plain.apply(lambda x: -x - 1.0)
    assert isinstance(new.blocks, tc.Stacked) and not tc.is_tree_equal(new, net)
    assert tc.is_tree_equal(new.blocks.unstack(), expected.blocks)
    assert tc.is_tree_equal(new.head, expected.head)
    # a leaf of a stack is an array in every block: the fill value fills its other slices
    got, want = stacked.get(fill_value=0.0), plain.get(fill_value=0.0)
    equal = jax.tree.map(
        lambda a, b: np.array_equal(np.broadcast_to(a, np.shape(b)), b),
        want.blocks,
        tc.unstack_all(got.blocks),
    )
    assert all(jax.tree.leaves(equal))


def test_at_where_sees_the_block_index_in_the_path():
    net = stacked_net(3)
    second = tc.where(lambda path, node: path[1:2] == (jax.tree_util.SequenceKey(1),))
    new = net.at[second]["norm"]["scale"].set(7.0)
    assert new.blocks.tree.norm.scale[:, 0].tolist() == [1.0, 7.0, 1.0]


def test_at_mask_with_one_flag_per_block():
    net = stacked_net(4)
    mask = net.at[...].set(False).at["blocks"][1:3].set(True)
    assert mask.blocks.tree.up.weight.tolist() == [False, True, True, False]
    zeroed = net.at[mask].set(0.0)
    sums = [float(jnp.abs(block.up.weight).sum()) for block in zeroed.blocks]
    assert sums[1] == sums[2] == 0.0 and sums[0] > 0 and sums[3] > 0


def test_at_mask_with_the_stacked_shapes_selects_elements():
    net = stacked_net(3)
    mask = jax.tree.map(lambda x: x > 0, net)
    new = net.at[mask].set(0.0)
    assert float(new.blocks.tree.up.weight.max()) <= 0.0


def test_at_selecting_the_stack_itself_hands_over_the_stacked_arrays():
    shapes = []
    stacked_net(3).at["blocks"].apply(lambda x: shapes.append(x.shape) or x)
    assert (3, WIDTH, WIDTH) in shapes


def test_at_on_the_stack_itself():
    stack = stacked_net(3).blocks
    new = stack.at[1]["norm"]["scale"].set(0.0)
    assert new.tree.norm.scale[:, 0].tolist() == [1.0, 0.0, 1.0]


def test_at_messages_name_the_block_index_in_the_path():
    net = stacked_net(3)

    def fail(x):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError) as info:
        net.at["blocks"][2]["up"]["weight"].apply(fail)
    assert "StackedNet.blocks[2].up.weight" in "\n".join(getattr(info.value, "__notes__", []))


def test_at_write_of_another_shape_names_the_path_and_leaves_the_input():
    net = stacked_net(3)
    before = np.asarray(net.blocks.tree.norm.scale).copy()
    with pytest.raises(TypeError, match=re.escape("StackedNet.blocks[1].norm.scale")):
        net.at["blocks"][1]["norm"]["scale"].set(jnp.ones(3))
    assert np.array_equal(net.blocks.tree.norm.scale, before)


def test_at_errors_below_a_class_selector_name_the_block_and_path():
    net = stacked_net(3)

    def fail(x):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError) as info:
        net.at["blocks"][2][Linear]["weight"].apply(fail)
    assert "StackedNet.blocks[2].up.weight" in "\n".join(getattr(info.value, "__notes__", []))
    with pytest.raises(TypeError, match=re.escape("block 1 of the stacked leaf at StackedNet.")):
        net.at["blocks"][1][Linear]["weight"].set(jnp.ones(3))


def test_at_error_in_a_stack_inside_a_dict_names_the_dict_path():
    tree = {"blocks": tc.Stacked({"w": jnp.zeros((3, 2))})}
    with pytest.raises(TypeError, match=re.escape("tree['blocks'][1]['w']")):
        tc.at(tree)["blocks"][1]["w"].set(jnp.ones(5))


def test_from_blocks_names_the_block_and_path_of_a_dtype_that_differs():
    blocks = [Block(jax.random.key(i)) for i in range(3)]
    blocks[1] = blocks[1].at["down"]["weight"].apply(lambda w: w.astype(jnp.float16))
    with pytest.raises(ValueError, match=re.escape("Block 1's array at blocks[1].down.weight")):
        tc.Stacked.from_blocks(blocks)


def test_from_blocks_names_a_leaf_that_is_an_array_in_one_block_only():
    with pytest.raises(TypeError, match=re.escape("Block 1's value at blocks[1]['w'] is 1.0")):
        tc.Stacked.from_blocks([{"w": jnp.ones(1)}, {"w": 1.0}])


def test_from_blocks_names_a_missing_field_and_the_block():
    blocks = [{"w": jnp.ones(1), "b": jnp.ones(1)}, {"w": jnp.ones(1)}]
    with pytest.raises(
        ValueError, match=r"Block 1 does not have block 0's structure at blocks\[1\]"
    ):
        tc.Stacked.from_blocks(blocks)


def test_at_write_of_a_bool_into_a_float_leaf_is_an_error():
    with pytest.raises(TypeError, match="dtype float32"):
        stacked_net(3).at["blocks"][1]["norm"]["scale"].set(True)


def test_at_index_out_of_range_is_an_index_error():
    with pytest.raises(IndexError, match="a Stacked of length 3"):
        stacked_net(3).at["blocks"][3].get()


def test_at_name_on_the_stack_says_to_index_blocks():
    with pytest.raises(LookupError, match=re.escape(".at[...]['up']")):
        stacked_net(3).at["blocks"]["up"].get()


def test_at_freezing_one_block_only_is_an_error():
    with pytest.raises(ValueError, match="frozen in block 1 but not in block 0"):
        stacked_net(3).at["blocks"][1]["norm"]["scale"].apply(tc.freeze)


def test_at_freezing_every_block_stacks_the_frozen_values():
    net = stacked_net(3).at["blocks"][...]["norm"]["scale"].apply(tc.freeze)
    assert tc.is_frozen(net.blocks.tree.norm.scale)
    assert tc.is_frozen(net.blocks[0].norm.scale)


def test_at_structure_change_in_one_block_is_an_error():
    with pytest.raises(ValueError, match=re.escape("StackedNet.blocks[1]")):
        stacked_net(3).at["blocks"][1]["norm"].set((1, 2))


def test_at_method_call_on_one_block():
    net = stacked_net(3)
    value, new = net.at["blocks"][1]["scale_up"](0.0)
    assert value == 0.0
    assert float(jnp.abs(new.blocks[1].up.weight).sum()) == 0.0
    assert np.array_equal(new.blocks[0].up.weight, net.blocks[0].up.weight)


def test_at_set_on_a_traced_model_inside_jit():
    @jax.jit
    def zero_block(m):
        return m.at["blocks"][1]["up"]["weight"].set(0.0)

    weights = zero_block(stacked_net(3)).blocks.tree.up.weight
    assert float(jnp.abs(weights[1]).sum()) == 0.0 and float(jnp.abs(weights[0]).sum()) > 0


def test_slice_selector_also_works_on_lists():
    assert tc.at([1, 2, 3, 4])[1:3].set(0) == [1, 0, 0, 4]
    assert tc.at({"a": [1, 2, 3]})["a"][::2].apply(lambda x: -x) == {"a": [-1, 2, -3]}


def test_slice_on_named_children_is_an_error():
    with pytest.raises(TypeError, match="named children"):
        tc.at({"a": 1, "b": 2})[0:1].get()


# -- printing -------------------------------------------------------------------------------


def test_repr_shows_the_count_and_per_block_shapes():
    text = tc.tree_repr(stacked_net(5), width=200)
    assert "blocks=Stacked[5×Block](" in text
    assert "weight=5×f32[4,4](" in text
    assert "f32[5,4,4]" not in text


def test_diagram_shows_the_stack_as_one_node():
    diagram = tc.tree_diagram(stacked_net(5), depth=2)
    assert diagram.splitlines()[:3] == [
        "StackedNet",
        "├── .blocks:Stacked[5×Block]",
        "│   ├── .norm=Norm(...)",
    ]


def test_summary_rows_give_per_block_type_and_totals():
    table = tc.tree_summary(stacked_net(5))
    row = next(line for line in table.splitlines() if ".blocks.up.weight" in line)
    assert "5×f32[4,4]" in row and "80" in row and "320B" in row


def test_summary_cut_by_depth_names_the_stack():
    table = tc.tree_summary(stacked_net(5), depth=1)
    row = next(line for line in table.splitlines() if ".blocks" in line)
    assert "Stacked[5×Block]" in row


def test_frozen_stacked_leaves_print_marked():
    net = stacked_net(2).at["blocks"][...]["norm"]["scale"].apply(tc.freeze)
    assert ".scale=#2×f32[4]" in tc.tree_diagram(net)


def test_summary_roles_are_the_stacked_arrays_roles():
    net = stacked_net(2).at["blocks"][...]["norm"]["scale"].apply(tc.freeze)
    lines = [line for line in tc.tree_summary(net).splitlines() if line.startswith("│")]
    rows = {line.split("│")[1].strip(): line for line in lines}
    assert "frozen" in rows[".blocks.norm.scale"] and "trainable" in rows[".blocks.up.weight"]


def test_html_shows_the_stack():
    page = stacked_net(3)._repr_html_()
    assert ".blocks:Stacked[3×Block]" in page and "3×f32[4,4]" in page


def test_treescope_renders_the_stack():
    treescope = pytest.importorskip("treescope")
    text = treescope.render_to_text(stacked_net(3))
    assert "Stacked[3×Block](" in text and "3×f32[4,4]" in text


def test_treescope_shows_a_stack_as_the_other_printers_do_and_marks_it_in_roundtrip_mode():
    treescope = pytest.importorskip("treescope")
    net = stacked_net(3)
    with treescope.using_expansion_strategy(target_width=0):
        text = treescope.render_to_text(net.blocks)
    assert text.startswith("Stacked[3×Block](") and "norm=" in text and "down=" in text
    # `Stacked[3×Block](...)` does not evaluate: round-trip mode marks it, as for a TreeClass
    roundtrip = treescope.render_to_text(net.blocks, roundtrip_mode=True)
    assert roundtrip.startswith("<Stacked[3×Block](") and roundtrip.rstrip().endswith(")>")


# -- optimizer settings ---------------------------------------------------------------------


def test_optim_mask_of_whole_leaves_on_a_stacked_model():
    net = stacked_net(3)
    mask = tc.optim.mask(net.at[Linear]["weight"])
    assert mask.blocks.tree.up.weight is True and mask.blocks.tree.norm.scale is False
    assert mask.head.weight is True
    opt = optax.masked(optax.sgd(0.1), mask)
    updates, _ = opt.update(jax.tree.map(jnp.ones_like, net), opt.init(net), net)
    assert float(jnp.abs(updates.blocks.tree.up.weight).min()) == pytest.approx(0.1)


def test_optim_labels_on_a_stacked_model():
    net = stacked_net(3)
    labels = tc.optim.labels(net, {"decay": net.at[Linear]["weight"]})
    assert labels.tree.blocks.tree.down.weight == "decay"
    assert labels.tree.blocks.tree.down.bias == "rest"
    opt = optax.multi_transform({"decay": optax.adamw(1e-3), "rest": optax.adam(1e-3)}, labels)
    opt.init(net)


def test_optim_trainable_on_a_stacked_model():
    net = stacked_net(3)
    grads = jax.tree.map(jnp.ones_like, net)
    for selection in (net, net.at[Linear]["weight"]):
        opt = tc.optim.trainable(optax.sgd(0.1), selection)
        updates, _ = opt.update(grads, opt.init(net), net)
        new = optax.apply_updates(net, updates)
        assert np.allclose(new.blocks.tree.up.weight, net.blocks.tree.up.weight - 0.1)
    assert np.array_equal(new.blocks.tree.norm.scale, net.blocks.tree.norm.scale)


def test_optim_mask_of_some_blocks_points_to_per_block_factors():
    with pytest.raises(ValueError, match=re.escape("tc.optim.scale_blocks(factors)")):
        tc.optim.mask(stacked_net(3).at["blocks"][0:2])


@pytest.mark.parametrize(
    "build",
    [
        lambda net: tc.optim.trainable(optax.sgd(0.1), net.at["blocks"][0:2]),
        lambda net: tc.optim.labels(net, {"first": net.at["blocks"][0]}),
    ],
    ids=["trainable", "labels"],
)
def test_optim_selections_of_some_blocks_point_to_per_block_factors(build):
    with pytest.raises(ValueError, match=re.escape("tc.optim.scale_blocks(factors)")) as info:
        build(stacked_net(3))
    assert "part of the leaf at " in str(info.value)  # the message names the leaf


def _train(model, opt, steps=4):
    loss_fn = lambda m: jnp.mean((m(x_batch()) - 1.0) ** 2)

    @jax.jit
    def step(model, state):
        loss, grads = jax.value_and_grad(loss_fn)(model)
        updates, state = opt.update(grads, state, model)
        return optax.apply_updates(model, updates), state, loss

    state, losses = opt.init(model), []
    for _ in range(steps):
        model, state, loss = step(model, state)
        losses.append(float(loss))
    return model, losses


def test_freezing_the_first_blocks_trains_as_the_unstacked_model_does():
    net = stacked_net(3)
    factors = net.at[...].set(1.0).at["blocks"][0:2].set(0.0)
    trained, losses = _train(net, optax.chain(optax.adam(1e-2), tc.optim.scale_blocks(factors)))

    plain = unstacked(net)
    frozen = {"frozen": plain.at["blocks"][0:2]}
    opt = tc.optim.partition(
        {"frozen": optax.set_to_zero(), "rest": optax.adam(1e-2)}, plain, frozen
    )
    plain_trained, plain_losses = _train(plain, opt)

    assert np.allclose(losses, plain_losses, rtol=1e-5, atol=1e-6)
    assert close(tc.unstack_all(trained), plain_trained, tol=1e-5)
    assert np.array_equal(trained.blocks[0].up.weight, net.blocks[0].up.weight)


def test_a_learning_rate_per_block_trains_as_the_unstacked_model_does():
    net = stacked_net(3)
    decay = 0.5 ** jnp.arange(2, -1, -1)  # layer-wise decay: the last block learns fastest
    factors = net.at[...].set(1.0).at["blocks"].set(decay)
    _, losses = _train(net, optax.chain(optax.adam(1e-2), tc.optim.scale_blocks(factors)))

    plain = unstacked(net)
    selections = {f"block{i}": plain.at["blocks"][i] for i in range(3)}
    transforms = {f"block{i}": optax.adam(1e-2 * float(decay[i])) for i in range(3)}
    transforms["rest"] = optax.adam(1e-2)
    opt = tc.optim.partition(transforms, plain, selections)
    _, plain_losses = _train(plain, opt)
    assert np.allclose(losses, plain_losses, rtol=1e-5, atol=1e-6)


def test_scale_blocks_names_where_the_factors_do_not_fit():
    net = stacked_net(3)
    factors = {"blocks": 1.0}
    opt = tc.optim.scale_blocks(factors)
    with pytest.raises(ValueError, match="do not fit the updates"):
        opt.update(jax.tree.map(jnp.ones_like, net), opt.init(net))


# -- checkpoints ----------------------------------------------------------------------------


def test_unstacked_checkpoint_loads_into_the_stacked_model(tmp_path):
    net = stacked_net(3)
    path = os.fspath(tmp_path / "plain.safetensors")
    tc.save(path, unstacked(net))
    template = stacked_net(3).at["blocks"][...]["up"]["weight"].apply(jnp.zeros_like)
    loaded = tc.restack(tc.load(path, tc.unstack_all(template)), template)
    assert isinstance(loaded.blocks, tc.Stacked)
    assert tc.is_tree_equal(loaded, net)


def test_stacked_checkpoint_loads_into_the_unstacked_model(tmp_path):
    net = stacked_net(3)
    path = os.fspath(tmp_path / "stacked.safetensors")
    tc.save(path, net)
    plain = unstacked(stacked_net(3).at[...].apply(jnp.zeros_like))
    loaded = tc.restack(tc.load(path, tc.restack(plain, net)), plain)
    assert type(loaded) is Net and type(loaded.blocks) is tuple
    assert tc.is_tree_equal(loaded, unstacked(net))


def test_unstack_all_names_tensors_per_block(tmp_path):
    path = os.fspath(tmp_path / "plain.safetensors")
    tc.save(path, tc.unstack_all(stacked_net(2)))
    state = tc.state_dict(tc.unstack_all(stacked_net(2)))
    assert state["blocks"][1]["up"]["weight"].shape == (WIDTH, WIDTH)


def test_restack_round_trips_exactly():
    net = stacked_net(3)
    plain = tc.unstack_all(net)
    assert tc.is_tree_equal(tc.restack(plain, net), net)
    assert tc.is_tree_equal(tc.restack(tc.restack(plain, net), plain), plain)


def test_restack_names_a_different_number_of_blocks():
    with pytest.raises(ValueError, match=re.escape("StackedNet.blocks")):
        tc.restack(tc.unstack_all(stacked_net(3)), stacked_net(4))


# -- one block by index: the walker's one-child path ------------------------------------------


@pytest.mark.parametrize("index", [0, 2, -1, -5])
@pytest.mark.parametrize(
    "edit",
    [
        lambda at: at["up"]["weight"].set(7.0),
        lambda at: at["up"]["weight"].apply(lambda w: w * 2),
        lambda at: at["norm"]["scale"].set(jnp.full(WIDTH, 3.0)),
        lambda at: at["up"]["bias"].set(jnp.ones(WIDTH, jnp.int32)),  # cast to the stack's
        lambda at: at["norm"]["eps"].set(0.5),  # a static field shared by every block
        lambda at: at["down"].apply(lambda layer: tc.freeze(layer), whole=True),
    ],
)
def test_one_block_by_index_edits_as_the_general_walk_does(index, edit):
    # `[index]` looks one block up (one slice per leaf); `[(index,)]` opens every block
    net = stacked_net()
    try:
        want = edit(net.at["blocks"][(index,)])
    except (ValueError, TypeError) as error:
        with pytest.raises(type(error)) as info:
            edit(net.at["blocks"][index])
        assert str(info.value) == str(error)
        return
    got = edit(net.at["blocks"][index])
    assert isinstance(got.blocks, tc.Stacked)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    assert close(got, want, tol=0)
    assert [x.dtype for x in jax.tree.leaves(got)] == [x.dtype for x in jax.tree.leaves(want)]
    assert close(net, stacked_net(), tol=0)  # the input is as it was


def test_one_block_by_index_out_of_range_names_the_stack():
    net = stacked_net()
    with pytest.raises((IndexError, LookupError), match="blocks"):
        net.at["blocks"][5]["up"]["weight"].set(0.0)


def test_one_block_structure_error_names_the_changed_leaf_past_frozen_ones():
    # a frozen leaf before the changed one is not where the block stops fitting
    stack = tc.Stacked.from_blocks(
        [{"f": tc.freeze(jnp.arange(3.0) + k), "w": jnp.full(2, float(k))} for k in range(3)]
    )
    for index in (1, (1,)):
        with pytest.raises(ValueError, match=re.escape("Stacked[1]['w']")):
            stack.at[index]["w"].set(None)


@pytest.mark.parametrize("index", [1, (1,)])
def test_a_traced_python_float_does_not_truncate_into_an_int_block(index):
    # under jit a Python number is a weak-typed scalar: it fits a block as the number would
    stack = tc.Stacked.from_blocks([{"i": jnp.arange(2) + k, "f": jnp.ones(2)} for k in range(3)])
    set_i = jax.jit(lambda s, v: s.at[index]["i"].set(v))
    with pytest.raises(TypeError, match=re.escape("Stacked[1]['i']")):
        set_i(stack, 2.7)
    out = set_i(stack, 5)
    assert out.unstack()[1]["i"].tolist() == [5, 5] and out.unstack()[1]["i"].dtype == jnp.int32
    out = jax.jit(lambda s, v: s.at[index]["f"].set(v))(stack, 3)  # an int into floats fits
    assert out.unstack()[1]["f"].tolist() == [3.0, 3.0]


# -- the dtypes of real models: every float and int dtype, weak types, PRNG keys ---------------

_DTYPE_NAMES = (
    "bool_ int2 int4 int8 int16 int32 int64 uint2 uint4 uint8 uint16 uint32 uint64 "
    "float4_e2m1fn float8_e3m4 float8_e4m3 float8_e4m3b11fnuz float8_e4m3fn float8_e4m3fnuz "
    "float8_e5m2 float8_e5m2fnuz float8_e8m0fnu bfloat16 float16 float32 float64 complex64 "
    "complex128"
).split()
DTYPES = [np.dtype(getattr(jnp, name)) for name in _DTYPE_NAMES if hasattr(jnp, name)]
# with 64-bit types off JAX holds the 64-bit dtypes as NumPy arrays only
JAX_DTYPES = [d for d in DTYPES if jax.dtypes.canonicalize_dtype(d) == d and device_holds(d)]


def _kind(dtype):
    for kind, category in [
        ("b", jnp.bool_),
        ("i", jnp.signedinteger),
        ("u", jnp.unsignedinteger),
        ("f", jnp.floating),
        ("c", jnp.complexfloating),
    ]:
        if jnp.issubdtype(dtype, category):
            return kind
    raise AssertionError(dtype)


def _stack_of(dtype, backend):
    base = np.arange(6).reshape(3, 2) % 2
    array = base.astype(dtype)
    return tc.Stacked({"w": array if backend == "numpy" else jnp.asarray(array)})


def _kept(value, dtype):
    """Whether `dtype` keeps the number `value` (up to rounding), worked out the long way."""
    kind = _kind(dtype)
    if kind in "iu":
        info = jnp.iinfo(dtype)
        return int(info.min) <= int(value) <= int(info.max)
    if kind == "b":
        return True
    real = np.finfo(np.float32).dtype if kind == "c" else None
    parts = [value.real, value.imag] if isinstance(value, complex) else [value]
    target = jnp.finfo(dtype).dtype if real is not None else dtype
    for part in parts:
        part = float(part)
        with np.errstate(over="ignore", invalid="ignore"):
            cast = float(np.asarray(part).astype(target).astype(np.float64))
        if np.isnan(part) != np.isnan(cast):
            return False
        if not np.isnan(part) and np.isinf(part) and cast != part:
            return False
        if np.isfinite(part):
            info = jnp.finfo(dtype)
            top = float(info.max)
            step = 2.0 ** (float(np.floor(np.log2(top))) - info.nmant)  # the two largest
            if not np.isfinite(cast) or abs(part) >= top + step / 2:
                return False
    return True


def _expected(value, dtype):
    """`(fits, value)`: whether `dtype` keeps the Python number `value` (True), refuses its
    kind (False) or its value ("refused"), worked out the long way from the rule: a number
    is judged by its value (`0.0` fits ints, `1` fits bools), a bool fits bools only."""
    kind = _kind(dtype)
    if isinstance(value, bool):
        return kind == "b", value
    if isinstance(value, complex) and kind != "c":
        if value.imag != 0:
            return False, value
        value = value.real
    if kind in "biu" and isinstance(value, float):
        if not (np.isfinite(value) and value == int(value)):
            return False, value
    if kind == "b":
        return (int(value) in (0, 1)) or "refused", value
    return _kept(value, dtype) or "refused", value


numbers = st.one_of(
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.integers(-300, 300),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(-1e6, 1e6),
    st.complex_numbers(max_magnitude=1e40, allow_nan=False),
)


# each dtype's own set and apply are checked one by one below; this law samples the rest
@settings(max_examples=60, deadline=None)
@given(
    dtype=st.sampled_from(DTYPES),
    backend=st.sampled_from(["numpy", "jax"]),
    value=numbers,
    index=st.sampled_from([1, -1, slice(0, 2), (0, 2)]),
)
def test_a_number_into_a_block_of_every_dtype_is_kept_or_refused_naming_the_leaf(
    dtype, backend, value, index
):
    if backend == "jax" and dtype not in JAX_DTYPES:
        backend = "numpy"
    stack = _stack_of(dtype, backend)
    before = np.array(stack.tree["w"])
    fits, kept = _expected(value, dtype)
    if fits is True:
        out = stack.at[index]["w"].set(value)
        got = np.asarray(out.tree["w"])
        assert got.dtype == dtype and type(out.tree["w"]) is type(stack.tree["w"])
        chosen = range(3)[index] if isinstance(index, slice) else np.atleast_1d(index)
        chosen = {k % 3 for k in chosen}
        with np.errstate(over="ignore", invalid="ignore"):
            want = np.full((2,), kept).astype(dtype) if _kind(dtype) != "c" else None
        for k in range(3):
            if k not in chosen:
                assert got[k].tobytes() == before[k].tobytes()
            elif want is not None:
                assert np.array_equal(got[k], want, equal_nan=_kind(dtype) == "f")
            else:
                assert np.array_equal(got[k], np.full((2,), complex(value), dtype), equal_nan=True)
    else:
        error = TypeError if fits is False else ValueError
        with pytest.raises(error, match=re.escape("Stacked[") + r"\d\]\['w'\]"):
            stack.at[index]["w"].set(value)
    assert np.asarray(stack.tree["w"]).tobytes() == before.tobytes()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_number_of_the_dtypes_kind_sets_and_applies_on_one_block(dtype):
    backend = "jax" if dtype in JAX_DTYPES else "numpy"
    stack = _stack_of(dtype, backend)
    value = {"b": True, "i": 1, "u": 1, "f": 2.0, "c": 1 + 2j}[_kind(dtype)]
    set_one = stack.at[1]["w"].set(value)
    applied = stack.at[1]["w"].apply(lambda _: value)
    for out in (set_one, applied):
        assert out.tree["w"].dtype == dtype
        assert np.array_equal(np.asarray(out[1]["w"]), np.full((2,), value, dtype))
        assert np.asarray(out[0]["w"]).tobytes() == np.asarray(stack[0]["w"]).tobytes()


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn", "int4"])
def test_the_dtypes_of_pretrained_models_take_a_python_number_in_a_block(dtype):
    dtype = np.dtype(getattr(jnp, dtype))
    stack = tc.Stacked({"w": jnp.zeros((3, 2), dtype)})
    value = 2.5 if _kind(dtype) == "f" else 2
    out = stack.at[1]["w"].set(value)
    assert out.tree["w"].dtype == dtype
    assert np.asarray(out[1]["w"]).astype(np.float32).tolist() == [value, value]
    assert np.asarray(out[0]["w"]).astype(np.float32).tolist() == [0.0, 0.0]


def _weak_stack():
    return tc.Stacked({"w": jax.lax.broadcast(jnp.asarray(1.0), (3, 2))})


@pytest.mark.parametrize(
    "edit",
    [
        lambda s: s.at[1]["w"].set(2.0),
        lambda s: s.at[(1,)]["w"].set(2.0),
        lambda s: s.at[0:2]["w"].set(2.0),
        lambda s: s.at[1]["w"].apply(lambda w: w * 3),
        lambda s: s.at[1]["w"].set(jnp.full((2,), 2.0)),
        lambda s: jax.jit(lambda s: s.at[1]["w"].set(2.0))(s),
        lambda s: jax.jit(lambda s, v: s.at[-1]["w"].set(v))(s, 5.0),
    ],
    ids=["set", "set-tuple", "set-slice", "apply", "set-array", "jit-set", "jit-traced"],
)
def test_block_edits_keep_a_weak_leaf_weak(edit):
    stack = _weak_stack()
    assert stack.tree["w"].weak_type
    out = edit(stack)
    assert out.tree["w"].weak_type and out.tree["w"].dtype == jnp.float32
    assert out.tree["w"][2].tolist() != [1.0, 1.0] or out.tree["w"][1].tolist() != [1.0, 1.0]


def test_block_edits_keep_a_strong_leaf_strong():
    stack = tc.Stacked({"w": jnp.ones((3, 2))})
    out = jax.jit(lambda s, v: s.at[1]["w"].set(v))(stack, 2.0)
    assert not out.tree["w"].weak_type and out[1]["w"].tolist() == [2.0, 2.0]


class Keyed(tc.TreeClass):
    key: jax.Array
    w: jax.Array


class KeyedNet(tc.TreeClass):
    blocks: tc.Stacked


def _keyed(seed=0):
    return KeyedNet(
        tc.Stacked.from_blocks([Keyed(jax.random.key(seed + i), jnp.ones(2)) for i in range(3)])
    )


def test_equality_of_stacked_models_holding_prng_keys():
    assert _keyed() == _keyed()
    assert _keyed() != _keyed(1)
    assert tc.is_tree_equal(_keyed(), _keyed())
    assert bool(jax.jit(lambda a, b: a == b)(_keyed(), _keyed()))
    other_impl = jax.random.key(0, impl="rbg")
    assert not tc.is_tree_equal(jax.random.key(0), other_impl)


def test_a_block_of_prng_keys_takes_a_key_and_refuses_a_number():
    model = _keyed()
    out = model.at["blocks"][1]["key"].set(jax.random.key(7))
    assert jax.random.key_data(out.blocks[1].key).tolist() == (
        jax.random.key_data(jax.random.key(7)).tolist()
    )
    assert out.at["blocks"][0]["key"].get() is not None
    with pytest.raises(TypeError, match=re.escape("blocks[1].key")):
        model.at["blocks"][1]["key"].set(7)


# -- numbers out of a dtype's range: an error naming the leaf, never a wrap --------------------


@pytest.mark.parametrize(
    "dtype, value",
    [
        ("int8", np.int64(300)),
        ("int8", 300),
        ("int8", np.uint8(200)),
        ("int8", np.int16(-200)),
        ("int8", 2**70),
        ("uint8", -1),
        ("uint8", np.int8(-1)),
        ("int4", 8),
        ("float16", 1e6),
        ("float16", np.float64(1e300)),
        ("float16", 2**70),
        ("float4_e2m1fn", float("inf")),
        ("float4_e2m1fn", float("nan")),
        ("float8_e4m3fn", 1000.0),
        ("float8_e8m0fnu", 0.0),
        ("complex64", 1e300j),
    ],
    ids=str,
)
def test_a_number_out_of_the_dtypes_range_is_an_error_naming_the_leaf(dtype, value):
    if not hasattr(jnp, dtype):
        pytest.skip(f"this JAX has no {dtype}")
    model = {"blocks": tc.Stacked({"w": jnp.zeros((3, 2), getattr(jnp, dtype))})}
    before = np.asarray(model["blocks"].tree["w"]).copy()
    with pytest.raises(ValueError, match=re.escape("tree['blocks'][1]['w']")) as info:
        tc.at(model)["blocks"][1]["w"].set(value)
    assert np.dtype(getattr(jnp, dtype)).name in str(info.value)
    assert np.asarray(model["blocks"].tree["w"]).tobytes() == before.tobytes()


def test_a_numpy_scalar_of_another_kind_is_refused_naming_its_type():
    stack = tc.Stacked({"w": jnp.zeros((3, 2), jnp.int8)})
    with pytest.raises(TypeError, match=r"np\.float32\(2\.5\).*a `numpy\.float32` is not of int8"):
        stack.at[1]["w"].set(np.float32(2.5))
    with pytest.raises(TypeError, match="numpy.complex64"):
        tc.Stacked({"w": jnp.zeros((3,))}).at[1]["w"].set(np.complex64(1j))
    with pytest.raises(TypeError, match="numpy.bool"):
        tc.Stacked({"w": jnp.zeros((3,), jnp.int32)}).at[1]["w"].set(np.bool_(True))


def test_a_concrete_weak_scalar_out_of_range_is_an_error():
    stack = tc.Stacked({"w": jnp.zeros((3, 2), jnp.int8)})
    with pytest.raises(ValueError, match=r"int8 holds the integers -128 to 127"):
        stack.at[1]["w"].set(jnp.asarray(300))
    assert stack.at[1]["w"].set(jnp.asarray(100))[1]["w"].tolist() == [100, 100]


def test_a_number_in_range_of_a_wider_numpy_type_fits():
    stack = tc.Stacked({"w": jnp.zeros((3, 2), jnp.int8)})
    assert stack.at[1]["w"].set(np.int64(-128))[1]["w"].tolist() == [-128, -128]
    assert stack.at[1]["w"].set(np.uint64(127))[1]["w"].tolist() == [127, 127]


def test_from_init_with_no_keys_is_an_error():
    keys = jax.random.split(jax.random.key(0), 0)
    with pytest.raises(ValueError, match="at least one block"):
        tc.Stacked.from_init(lambda k: {"w": jax.random.normal(k, (2,))}, keys)


def test_a_stack_of_attention_layers_has_its_heads_checked_through_its_block():
    # the stack's children are its block's fields: their declared heads are the block's
    def build():
        return tc.Stacked.from_init(
            lambda k: tc.nn.MultiHeadAttention(16, 4, num_kv_heads=2, key=k),
            jax.random.split(jax.random.key(0), 3),
        )

    rules = tc.ShardingRules(
        [(tc.glob("*.k_proj.weight"), ("heads", None))],
        axes={"heads": "model"},
        unmatched="replicate",
    )
    mesh = jax.sharding.AbstractMesh((2, 4), ("data", "model"))
    with pytest.raises(
        ValueError, match=r"cuts its 2 heads \(MultiHeadAttention\.num_kv_heads=2\)"
    ):
        rules.specs(jax.eval_shape(build), mesh)
    fits = rules.with_axes(heads="data")  # 2 devices: one key/value head each
    assert fits.specs(jax.eval_shape(build), mesh).tree.k_proj.weight == jax.sharding.PartitionSpec(
        None, "data", None
    )


def test_a_set_over_a_frozen_leaf_through_every_block_answers_as_one_block_does():
    # a frozen spot is a node: a frozen value replaces it whole, a plain array reaches no
    # leaf; the stack's every-block route and one unstacked block give the same answer
    block = Linear(tc.freeze(jnp.ones(2)), jnp.zeros(2))
    stack = tc.Stacked.from_blocks([block] * 3)
    for indexer in (block.at["weight"], stack.at[...]["weight"]):
        with pytest.raises(LookupError, match="reaches no leaves"):
            indexer.set(jnp.zeros(2))
    one = block.at["weight"].set(tc.freeze(jnp.zeros(2)))
    every = stack.at[...]["weight"].set(tc.freeze(jnp.zeros(2)))
    assert tc.is_frozen(one.weight)
    for b in every:
        assert tc.is_frozen(b.weight)
        np.testing.assert_array_equal(tc.unfreeze(b.weight), np.zeros(2))
