"""Sharding rules on 8 CPU devices; run by tests/test_sharding.py in a subprocess.

The model is the transformer of docs/recipes/sharding.md and its rule table, taken from
the page itself (the python blocks of its section "A transformer and its rule table"),
so what the page shows is what is checked here: built in place with FSDP, tensor
parallel and both, trained against one device, its optimizer state placed like it,
loaded into a template of the rules, and printed. The last stdout line is a JSON object:
check name -> "ok" or the failure's traceback.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import functools  # noqa: E402
import pathlib  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from multidevice import page_definitions, report  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout under test (an installed one may be another)

import treeclass as tc  # noqa: E402

PAGE = ROOT / "docs" / "recipes" / "sharding.md"
SECTION = "## A transformer and its rule table"


PAGE_NS = page_definitions(PAGE, SECTION)
Transformer, RULES, loss_fn = PAGE_NS["Transformer"], PAGE_NS["RULES"], PAGE_NS["loss_fn"]
KEY = jax.random.key(0)
FSDP = RULES.with_axes(embed="data")
TENSOR = RULES.with_axes(heads="model", mlp="model", vocab="model")
BOTH = TENSOR.with_axes(embed="data")
AUTO = (AxisType.Auto,) * 2
MESH_1D = jax.make_mesh((8,), ("data",), axis_types=AUTO[:1])
MESH_2D = jax.make_mesh((2, 4), ("data", "model"), axis_types=AUTO)


@functools.cache
def reference() -> Any:
    """The model built whole on one device (in one program: cheaper than op by op)."""
    with jax.default_device(jax.devices()[0]):
        return jax.jit(Transformer)(KEY)


def assert_placed(tree: Any, shardings: Any) -> None:
    pairs = zip(
        jax.tree_util.tree_flatten_with_path(tree)[0], jax.tree.leaves(shardings), strict=True
    )
    for (path, leaf), target in pairs:
        where = jax.tree_util.keystr(path)
        assert leaf.sharding.is_equivalent_to(target, leaf.ndim), (where, leaf.sharding, target)


def assert_close(a: Any, b: Any, rtol: float = 1e-6) -> None:
    for (path, x), y in zip(
        jax.tree_util.tree_flatten_with_path(a)[0], jax.tree.leaves(b), strict=True
    ):
        np.testing.assert_allclose(
            np.asarray(x), np.asarray(y), rtol=rtol, atol=1e-6, err_msg=jax.tree_util.keystr(path)
        )


def assert_built_in_place(rules: Any, mesh: Any) -> Any:
    model = rules.init(mesh, Transformer, KEY)
    shardings = rules.shardings(jax.eval_shape(Transformer, KEY), mesh)
    assert_placed(model, shardings)
    assert_close(model, reference())
    # each device holds its part of each leaf, not the leaf
    for leaf, sharding in zip(jax.tree.leaves(model), jax.tree.leaves(shardings), strict=True):
        want = sharding.shard_shape(leaf.shape)
        assert all(s.data.shape == want for s in leaf.addressable_shards), (leaf.shape, want)
    return model


# each layout's model, built in place and checked once, then shared by the checks that use it
@functools.cache
def fsdp_model() -> Any:
    return assert_built_in_place(FSDP, MESH_1D)


@functools.cache
def both_model() -> Any:
    return assert_built_in_place(BOTH, MESH_2D)


CHECKS: dict[str, Callable[[], None]] = {}


def check(fn: Callable[[], None]) -> Callable[[], None]:
    CHECKS[fn.__name__] = fn
    return fn


@check
def eight_devices() -> None:
    assert jax.device_count() == 8, jax.devices()


@check
def page_transformer_fsdp_in_place() -> None:
    model = fsdp_model()
    assert model.embed.sharding.spec == P(None, "data")
    weight = model.blocks.tree.up.weight  # f32[2, 32, 64], the embedding axis over 8
    assert weight.sharding.spec == P(None, "data", None)
    assert weight.addressable_shards[0].data.shape == (2, 4, 64)


@check
def page_transformer_tensor_parallel_in_place() -> None:
    model = assert_built_in_place(TENSOR, MESH_2D)
    assert model.blocks.tree.attn.q.weight.sharding.spec == P(None, None, "model")
    assert model.blocks.tree.attn.out.weight.sharding.spec == P(None, "model", None)
    model = both_model()
    assert model.blocks.tree.up.weight.sharding.spec == P(None, "data", "model")
    assert model.blocks.tree.up.weight.addressable_shards[0].data.shape == (2, 16, 16)


@check
def no_device_holds_the_whole_model() -> None:
    # a model of 4 MiB: what one device allocates to build it (its output and every
    # temporary of the program `init` runs, as XLA plans it) stays well under the model
    def build() -> Any:
        return Transformer(KEY, vocab=1024, width=256, heads=4, hidden=512, depth=2)

    abstract = jax.eval_shape(build)
    total = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(abstract))
    shardings = BOTH.shardings(abstract, MESH_2D)
    compiled = jax.jit(build, out_shardings=shardings).lower().compile()
    memory = compiled.memory_analysis()
    per_device = memory.output_size_in_bytes + memory.temp_size_in_bytes
    assert per_device < total / 2, (per_device, total)
    model = BOTH.init(MESH_2D, build)
    held = sum(s.data.nbytes for x in jax.tree.leaves(model) for s in x.addressable_shards[:1])
    assert held <= total / 4, (held, total)


def train_step(opt: Any, model: Any, opt_state: Any, tokens: jax.Array) -> tuple[Any, ...]:
    loss, grads = jax.value_and_grad(loss_fn)(model, tokens)
    updates, opt_state = opt.update(grads, opt_state, model)
    return optax.apply_updates(model, updates), opt_state, loss


def tokens(mesh: Any | None) -> jax.Array:
    batch = jax.random.randint(jax.random.key(1), (8, 9), 0, 64)
    return batch if mesh is None else jax.device_put(batch, NamedSharding(mesh, P("data")))


@check
def train_step_keeps_shardings_and_matches_one_device() -> None:
    model = both_model()
    opt = tc.optim.trainable(optax.adamw(1e-2), model)
    opt_state = tc.init_like(opt.init, model)
    model_shardings = BOTH.shardings(jax.eval_shape(Transformer, KEY), MESH_2D)
    state_shardings = tc.shardings_like(opt_state, model_shardings)
    assert_placed(opt_state, state_shardings)
    step = jax.jit(
        functools.partial(train_step, opt), out_shardings=(model_shardings, state_shardings, None)
    )
    for _ in range(2):
        model, opt_state, loss = step(model, opt_state, tokens(MESH_2D))
    assert_placed(model, model_shardings)
    assert_placed(opt_state, state_shardings)
    ref = reference()
    ref_opt = tc.optim.trainable(optax.adamw(1e-2), ref)
    ref_state = ref_opt.init(ref)
    ref_step = jax.jit(functools.partial(train_step, ref_opt))
    for _ in range(2):
        ref, ref_state, ref_loss = ref_step(ref, ref_state, tokens(None))
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
    assert_close(model, ref, rtol=2e-4)


@check
def plain_optax_state_follows_the_model() -> None:
    model = fsdp_model()
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3))
    state = tc.init_like(opt.init, model)
    adam = state[1][0]
    for name in ("mu", "nu"):
        assert_placed(getattr(adam, name), jax.tree.map(lambda x: x.sharding, model))
    assert adam.count.sharding.is_fully_replicated
    assert adam.count.sharding.mesh == MESH_1D


@check
def load_reads_into_the_rules_template() -> None:
    model = fsdp_model()
    abstract = jax.eval_shape(Transformer, KEY)
    with tempfile.TemporaryDirectory() as folder:
        path = pathlib.Path(folder) / "model.safetensors"
        tc.save(path, model)
        restored = tc.load(path, BOTH.template(abstract, MESH_2D))  # another layout
    assert_placed(restored, BOTH.shardings(abstract, MESH_2D))
    assert_close(restored, reference())


@check
def summary_shows_every_leaf_spec() -> None:
    model = both_model()
    table = tc.tree_summary(model)
    rows = [line for line in table.splitlines() if line.startswith("│ .")]
    assert len(rows) == len(jax.tree.leaves(model)), table
    assert "P(None, 'data', 'model')" in table  # a stacked leaf's row
    assert all("P(" in row for row in rows), table
    template = tc.tree_summary(BOTH.template(jax.eval_shape(Transformer, KEY), MESH_2D))
    assert template.count("P(") == table.count("P("), (template, table)


@check
def misfit_on_the_real_mesh_is_refused_before_allocation() -> None:
    pipeline = RULES.with_axes(layers="data")  # 2 blocks over 8 devices
    live = len(jax.live_arrays())
    try:
        pipeline.init(MESH_1D, Transformer, KEY)
    except ValueError as error:
        text = str(error)
        assert "`Transformer.blocks.up.weight` f32[2,32,64] (stacked: 2 blocks" in text, text
        assert "splits axis 0 (size 2) in 8 over mesh axis 'data'" in text, text
    else:
        raise AssertionError("a block axis of 2 split in 8 was not refused")
    assert len(jax.live_arrays()) == live  # nothing was allocated


if __name__ == "__main__":
    report(CHECKS, limit=8)
