"""One JAX process of a many-process run on this machine; started by tests/test_multihost.py.

Usage: `python multihost_worker.py SCENARIO FOLDER PROCESS_ID PROCESS_COUNT PORT DEVICES`.

Each process simulates `DEVICES` CPU devices; with more than one process they join under
`jax.distributed` (the coordinator on 127.0.0.1:PORT, CPU collectives over gloo), as one
process per host would. A scenario is a list of checks run in order on every process;
each check reports "ok" or its traceback, and a check whose inputs a failed check should
have made reports that instead. Progress goes to stderr (`start: name` / `done: name`),
so that a run stopped by the test's time limit shows where it hung; the last stdout line
is the JSON object `{check name: "ok" or the traceback}`.

Scenarios:

- `train_and_save`: builds the model directly in its shardings, checks frozen values and
  inspection, runs one sharded train step against the same step on one device, saves
  model, optimizer state, PRNG key and step with orbax, and writes `expected.npz` (the
  one-device values, written by process 0) for the restore runs.
- `sharded_save`: a sharded `tc.save` of a model mixing every kind of sharding, written
  by every process (bytes per process counted), read back by `safetensors` and `tc.load`.
- `restore`: in fresh processes, restores that checkpoint into an abstract sharded
  template (on whatever processes and mesh this run has) and runs the next step.
- `sharding_rules`: the transformer of docs/recipes/sharding.md built in place from its
  rule table (FSDP over all devices; FSDP and tensor parallel on the 2-d mesh), one
  train step against one device, `tc.save` and `tc.load` into the rules' template.

The code follows docs/recipes/multihost.md, whose multi-process blocks are marked
`skip` there because they run here.
"""

from __future__ import annotations

import os
import sys
import time

STARTED = time.perf_counter()
SCENARIO, FOLDER = sys.argv[1], sys.argv[2]
PROCESS_ID, PROCESS_COUNT, PORT, DEVICES = map(int, sys.argv[3:7])

# the device count is fixed when jax starts, so before any import of it
# (the inherited flags kept: the tests' compiler settings, see conftest.py)
os.environ["XLA_FLAGS"] = " ".join(
    [*os.environ.get("XLA_FLAGS", "").split(), f"--xla_force_host_platform_device_count={DEVICES}"]
)
os.environ["JAX_PLATFORMS"] = "cpu"

import errno  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import pathlib  # noqa: E402
import re  # noqa: E402
import traceback  # noqa: E402
import tracemalloc  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import jax  # noqa: E402

# collectives between CPU processes (the default implementation has none)
jax.config.update("jax_cpu_collectives_implementation", "gloo")
if PROCESS_COUNT > 1:
    address = f"127.0.0.1:{PORT}"
    jax.distributed.initialize(
        coordinator_address=address,
        num_processes=PROCESS_COUNT,
        process_id=PROCESS_ID,
        coordinator_bind_address=address,  # never all interfaces
        initialization_timeout=30,
        heartbeat_timeout_seconds=20,
        shutdown_timeout_seconds=10,
    )

import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import treeclass as tc  # noqa: E402
import treeclass.optim  # noqa: E402, F401

VOCAB, WIDTH, HIDDEN, CLASSES = 32, 8, 16, 4
BATCH, LENGTH = 8, 4
CHECKPOINT = pathlib.Path(FOLDER) / "checkpoint"
EXPECTED = pathlib.Path(FOLDER) / "expected.npz"
TC_CHECKPOINT = pathlib.Path(FOLDER) / "model.safetensors"
SPREAD_CHECKPOINT = pathlib.Path(FOLDER) / "spread.safetensors"
BIG_CHECKPOINT = pathlib.Path(FOLDER) / "big.safetensors"
# the big model's size: two float32 matrices of BIG_MB / 2 each (MULTIHOST_BIG_MB=256 for
# the figures of docs/recipes/multihost.md)
BIG_MB = int(os.environ.get("MULTIHOST_BIG_MB", "16"))
BIG_COLS = 4096  # rows of 16 KiB: a quarter of one is a read of its own
BIG_ROWS = BIG_MB * 2**20 // (2 * 4 * BIG_COLS)

# -- the model ------------------------------------------------------------------------------


def sinusoids(length: int, width: int) -> np.ndarray:
    """Positional encodings, computed with NumPy: a frozen array that stays on the host."""
    angles = np.arange(length)[:, None] / 10_000 ** (np.arange(width)[None, :] / width)
    return np.where(np.arange(width) % 2 == 0, np.sin(angles), np.cos(angles)).astype("f4")


class Linear(tc.TreeClass):
    weight: jax.Array
    bias: jax.Array
    name: str = tc.field(default="linear", static=True)

    def __call__(self, x: jax.Array) -> jax.Array:
        return x @ self.weight + self.bias


class Classifier(tc.TreeClass):
    def __init__(self, key: jax.Array, embed: Any) -> None:
        k1, k2 = jax.random.split(key)
        self.embed = tc.freeze(embed)  # a pretrained table: frozen, replicated over the mesh
        self.positions = tc.freeze(sinusoids(LENGTH, WIDTH))  # frozen NumPy: on the host
        self.hidden = Linear(
            jax.random.normal(k1, (WIDTH, HIDDEN)) / WIDTH**0.5, jnp.zeros(HIDDEN), name="hidden"
        )
        self.head = Linear(
            jax.random.normal(k2, (HIDDEN, CLASSES)) / HIDDEN**0.5, jnp.zeros(CLASSES), name="head"
        )
        self.act = tc.freeze(jax.nn.tanh)

    def __call__(self, tokens: jax.Array, key: jax.Array) -> jax.Array:
        x = jnp.asarray(tc.unfreeze(self.embed))[tokens] + tc.unfreeze(self.positions)
        h = tc.unfreeze(self.act)(self.hidden(x.mean(axis=1)))
        keep = jax.random.bernoulli(key, 0.9, h.shape)  # dropout: the key matters
        return self.head(jnp.where(keep, h / 0.9, 0.0))


def table() -> np.ndarray:
    return np.random.default_rng(0).normal(size=(VOCAB, WIDTH)).astype("f4")


def batch(step: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(100 + step)
    return rng.integers(0, VOCAB, (BATCH, LENGTH)), rng.integers(0, CLASSES, BATCH)


def make_optimizer(model: Classifier) -> optax.GradientTransformation:
    # the mask holds the model's frozen values (they are structure): build it from the
    # model it will be used with
    return optax.adamw(1e-2, weight_decay=0.1, mask=tc.optim.mask(model.at[Linear]["weight"]))


def train_step(opt, model, opt_state, key, tokens, labels):
    key, dropout = jax.random.split(key)

    def loss_fn(model):
        logits = model(tokens, dropout)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    loss, grads = jax.value_and_grad(loss_fn)(model)
    updates, opt_state = opt.update(grads, opt_state, model)
    return optax.apply_updates(model, updates), opt_state, key, loss


class Big(tc.TreeClass):
    """A model of two large matrices, a frozen NumPy vector and a static name."""

    up: jax.Array
    down: jax.Array
    norm: Any
    name: str = tc.field(default="big", static=True)


def pattern(rows: Any, cols: Any, offset: float) -> Any:
    """Values that tell every element apart, from its row and column (jnp or NumPy)."""
    return ((rows * BIG_COLS + cols) % 997).astype("f4") + np.float32(offset)  # exact


def build_big() -> Big:
    rows, cols = jnp.arange(BIG_ROWS)[:, None], jnp.arange(BIG_COLS)[None, :]
    norm = tc.freeze(np.linspace(0, 1, BIG_COLS, dtype="f4"))
    return Big(pattern(rows, cols, 0.0), pattern(rows, cols, 1000.0), norm, name="big")


def assert_big(model: Big) -> None:
    """Every shard this process holds has the values `build_big` gives it."""
    for offset, array in ((0.0, model.up), (1000.0, model.down)):
        assert array.shape == (BIG_ROWS, BIG_COLS), array.shape
        for shard in array.addressable_shards:
            r, c = shard.index
            want = pattern(np.arange(BIG_ROWS)[r][:, None], np.arange(BIG_COLS)[c][None, :], offset)
            np.testing.assert_array_equal(np.asarray(shard.data), want)
    assert type(tc.unfreeze(model.norm)) is np.ndarray and model.name == "big"
    np.testing.assert_array_equal(tc.unfreeze(model.norm), np.linspace(0, 1, BIG_COLS, dtype="f4"))


# -- shardings ----------------------------------------------------------------------------------


def make_mesh() -> jax.sharding.Mesh:
    """`data` over the processes, `model` within each (one process: `model` over all)."""
    shape = (PROCESS_COUNT, jax.local_device_count())
    return jax.make_mesh(shape, ("data", "model"), axis_types=(AxisType.Auto,) * 2)


def model_shardings(model: Any, mesh: jax.sharding.Mesh) -> Any:
    """Per-leaf shardings from `.at` selections: hidden split by columns, head by rows."""
    shardings = jax.tree.map(lambda _: NamedSharding(mesh, P()), model)
    shardings = shardings.at["hidden"]["weight"].set(NamedSharding(mesh, P(None, "model")))
    shardings = shardings.at["hidden"]["bias"].set(NamedSharding(mesh, P("model")))
    return shardings.at["head"]["weight"].set(NamedSharding(mesh, P("model", None)))


def opt_shardings(opt_state: Any, shardings: Any, mesh: jax.sharding.Mesh) -> Any:
    """The optimizer state's parts shaped like the model take the model's shardings."""
    replicated = NamedSharding(mesh, P())
    return jax.tree.map(
        lambda x: shardings if isinstance(x, Classifier) else replicated,
        opt_state,
        is_leaf=lambda x: isinstance(x, Classifier),
    )


def with_shardings(abstract: Any, shardings: Any) -> Any:
    return jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, shardings
    )


def global_batch(step: int, mesh: jax.sharding.Mesh) -> tuple[jax.Array, jax.Array]:
    """The step's batch split along `data`: each process makes only its own rows."""
    rows = NamedSharding(mesh, P("data"))
    return tuple(
        jax.make_array_from_callback(x.shape, rows, lambda index, x=x: x[index])
        for x in batch(step)
    )


def init_sharded(mesh: jax.sharding.Mesh) -> Classifier:
    """The model made directly in its shardings: nothing is built whole on one device."""
    embed = jax.device_put(table(), NamedSharding(mesh, P()))  # every process: same table

    def build() -> Classifier:
        return Classifier(jax.random.key(0), embed)

    abstract = jax.eval_shape(build)
    return jax.jit(build, out_shardings=model_shardings(abstract, mesh))()


def start_training(model: Classifier, mesh: jax.sharding.Mesh) -> tuple[Any, Any, jax.Array]:
    """The optimizer, its state placed like the model, and a replicated PRNG key."""
    opt = make_optimizer(model)
    abstract = jax.eval_shape(opt.init, model)
    placed = opt_shardings(abstract, model_shardings(model, mesh), mesh)
    # without `out_shardings` the state would land on one device of each process:
    # `opt.init` makes zeros, which depend on no input's placement
    opt_state = jax.jit(opt.init, out_shardings=placed)(model)
    key = jax.jit(lambda: jax.random.key(1), out_shardings=NamedSharding(mesh, P()))()
    return opt, opt_state, key


def save_checkpoint(path: pathlib.Path, model: Any, opt_state: Any, key: Any, step: int) -> None:
    """One orbax checkpoint of the model, the optimizer state and the loop's state."""
    checkpointer = ocp.Checkpointer(ocp.CompositeCheckpointHandler())
    checkpointer.save(
        path,
        ocp.args.Composite(
            model=ocp.args.StandardSave(tc.state_dict(model)),  # frozen arrays included
            opt_state=ocp.args.StandardSave(opt_state),  # its leaves: no frozen copies
            loop=ocp.args.StandardSave({"key": key, "step": step}),
        ),
    )


def restore_checkpoint(path: pathlib.Path, mesh: jax.sharding.Mesh) -> tuple[Any, ...]:
    """`(model, opt, opt_state, key, step)` from `path`, each array read in its sharding."""
    replicated = NamedSharding(mesh, P())
    # a template without data; the frozen table's sharding says where it goes
    embed = jax.ShapeDtypeStruct((VOCAB, WIDTH), jnp.float32, sharding=replicated)
    abstract = jax.eval_shape(lambda: Classifier(jax.random.key(0), embed))
    template = with_shardings(abstract, model_shardings(abstract, mesh))
    key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=replicated)
    checkpointer = ocp.Checkpointer(ocp.CompositeCheckpointHandler())
    restored = checkpointer.restore(
        path,
        ocp.args.Composite(
            model=ocp.args.StandardRestore(tc.state_dict(template)),
            loop=ocp.args.StandardRestore({"key": key, "step": 0}),
        ),
    )
    model = tc.from_state_dict(template, restored["model"])
    # frozen values are part of a tree's structure: the optimizer (its mask) and its
    # state's template are built from the restored model, whose frozen values are real
    opt = make_optimizer(model)
    abstract_opt = jax.eval_shape(opt.init, model)
    placed = opt_shardings(abstract_opt, model_shardings(model, mesh), mesh)
    opt_state = checkpointer.restore(
        path,
        ocp.args.Composite(
            opt_state=ocp.args.StandardRestore(with_shardings(abstract_opt, placed))
        ),
    )["opt_state"]
    loop = restored["loop"]
    return model, opt, opt_state, loop["key"], int(loop["step"])


def save_with_tc(path: pathlib.Path, model: Any) -> None:
    # a model split across processes: every process calls it with the same tree and
    # path; process 0 writes the file, the others join the gathers of the arrays split
    # across processes, and all return once it is written
    tc.save(path, model)


def load_with_tc(path: pathlib.Path, mesh: jax.sharding.Mesh) -> Classifier:
    """The model from a `tc.save` file, each process reading only its shards' bytes."""
    embed = jax.ShapeDtypeStruct((VOCAB, WIDTH), jnp.float32, sharding=NamedSharding(mesh, P()))
    abstract = jax.eval_shape(lambda: Classifier(jax.random.key(0), embed))
    template = with_shardings(abstract, model_shardings(abstract, mesh))
    return tc.load(path, template)


# -- comparing global arrays with one-device values, process by process ---------------------------


def assert_matches(array: Any, expected: np.ndarray, where: str) -> None:
    """Each shard this process holds equals the same slice of `expected`."""
    if not isinstance(array, jax.Array):
        np.testing.assert_allclose(array, expected, rtol=2e-5, atol=2e-6, err_msg=where)
        return
    assert array.shape == expected.shape, (where, array.shape, expected.shape)
    for shard in array.addressable_shards:
        got = np.asarray(shard.data)
        np.testing.assert_allclose(got, expected[shard.index], rtol=2e-5, atol=2e-6, err_msg=where)


def named_arrays(tree: Any) -> dict[str, Any]:
    """`{key path: array}` of every array of `tree`, frozen ones included."""
    state = tc.state_dict(tree)
    paths, _ = jax.tree_util.tree_flatten_with_path(state)
    return {jax.tree_util.keystr(path): value for path, value in paths}


def assert_tree_matches(tree: Any, expected: dict[str, np.ndarray], prefix: str) -> None:
    arrays = named_arrays(tree)
    assert arrays, prefix
    for name, value in arrays.items():
        assert_matches(value, expected[prefix + name], prefix + name)


def assert_placed(tree: Any, shardings: Any) -> None:
    """Every leaf of `tree` is placed as the same leaf of `shardings` says."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    for (path, leaf), target in zip(leaves, jax.tree.leaves(shardings), strict=True):
        where = jax.tree_util.keystr(path)
        assert leaf.sharding.is_equivalent_to(target, leaf.ndim), (where, leaf.sharding, target)


# -- the checks -----------------------------------------------------------------------------------

state: dict[str, Any] = {}


def one_device_run() -> None:
    """The reference: the same two steps on one local device of this process, no mesh."""
    model = Classifier(jax.random.key(0), table())
    opt = make_optimizer(model)
    step = jax.jit(functools.partial(train_step, opt))
    opt_state, key = opt.init(model), jax.random.key(1)
    state["reference_init"] = model
    for i in (1, 2):
        model, opt_state, key, loss = step(model, opt_state, key, *map(jnp.asarray, batch(i)))
        state[f"reference_{i}"] = (model, opt_state, key, loss)


def init_in_shardings() -> None:
    mesh = make_mesh()
    model = init_sharded(mesh)
    state["mesh"], state["model"] = mesh, model
    assert_placed(model, model_shardings(model, mesh))
    assert not model.hidden.weight.is_fully_addressable  # spread over both processes
    reference = state["reference_init"]
    for (path, leaf), expected in zip(
        jax.tree_util.tree_flatten_with_path(model)[0], jax.tree.leaves(reference), strict=True
    ):
        assert_matches(leaf, np.asarray(expected), jax.tree_util.keystr(path))
    # frozen and static parts: placed as the recipe says, and not traced values
    embed = tc.unfreeze(model.embed)
    assert isinstance(embed, jax.Array) and not isinstance(embed, jax.core.Tracer)
    assert embed.is_fully_replicated and embed.sharding.mesh == mesh
    assert type(tc.unfreeze(model.positions)) is np.ndarray
    assert (model.hidden.name, model.head.name) == ("hidden", "head")
    assert tc.unfreeze(model.act) is jax.nn.tanh


def train_step_matches_one_device() -> None:
    mesh, model = state["mesh"], state["model"]
    opt, opt_state, key = start_training(model, mesh)
    shardings = model_shardings(model, mesh)
    assert_placed(opt_state, opt_shardings(opt_state, shardings, mesh))
    step = jax.jit(functools.partial(train_step, opt))
    model, opt_state, key, loss = step(model, opt_state, key, *global_batch(1, mesh))
    state["trained"] = (model, opt_state, key)
    ref_model, ref_opt, ref_key, ref_loss = state["reference_1"]
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
    for name, got, want in (("model", model, ref_model), ("opt_state", opt_state, ref_opt)):
        expected = {k: np.asarray(v) for k, v in named_arrays(want).items()}
        assert_tree_matches(got, expected, "")
        del name
    assert np.array_equal(jax.random.key_data(key), jax.random.key_data(ref_key))
    # the step keeps every leaf where it was
    assert_placed(model, shardings)


def frozen_values_work_in_jit() -> None:
    # replicated over the mesh (embed) and NumPy (positions): both close over into `jit`
    model = state["trained"][0]
    tokens, _ = global_batch(1, state["mesh"])
    logits = jax.jit(lambda m, t: m(t, jax.random.key(5)))(model, tokens)
    assert logits.shape == (BATCH, CLASSES)


def freezing_a_spread_array_is_refused() -> None:
    weight = state["trained"][0].hidden.weight
    try:
        tc.freeze(weight)
    except ValueError as error:
        text = str(error)
        assert "other processes" in text and "NamedSharding(mesh, P())" in text, text
    else:
        raise AssertionError("tc.freeze of a spread array was not refused")
    # the fix from the message works
    replicated = jax.device_put(weight, NamedSharding(state["mesh"], P()))
    assert tc.is_frozen(tc.freeze(replicated))


def _force_device_stats() -> Callable[[], None]:
    """Make the printers take their accelerator path (a jitted reduction) on CPU arrays.

    That path is the one that would wait for the other processes; on CPU it is normally
    skipped, so the printers' seam `reduce_on_device` forces it. Returns the undo.
    """
    from treeclass import _pprint

    saved = _pprint.reduce_on_device
    _pprint.reduce_on_device = lambda x: True

    def undo() -> None:
        _pprint.reduce_on_device = saved

    return undo


def inspection_from_one_process() -> None:
    try:
        if jax.process_index() == 0:  # the usual `if jax.process_index() == 0: print(model)`
            check_printers()
    finally:
        # every process gets here once process 0 has printed (a hang shows as a timeout)
        multihost_utils.sync_global_devices("printed")


def check_printers() -> None:
    import treescope  # draws TreeClass nodes through `__treescope_repr__`

    model, opt_state, _ = state["trained"]
    undo = _force_device_stats()
    try:
        texts = {
            "repr": repr(model),
            "str": str(model),
            "summary": tc.tree_summary(model),
            "diagram": tc.tree_diagram(model),
            "graph": tc.tree_graph(model),
            "mermaid": tc.tree_mermaid(model),
            "html": model._repr_html_(),
            "opt_state": tc.tree_repr(opt_state),
            "treescope": treescope.render_to_text(model),
        }
    finally:
        undo()
    print("\n".join(texts[k] for k in ("repr", "summary", "treescope")), file=sys.stderr)
    spread = "f32[8,16](sharded P(None, 'model') across 2 processes)"
    for name in ("repr", "str", "diagram", "graph", "mermaid", "opt_state"):
        assert spread in texts[name], (name, texts[name])
    assert "sharded P(None, &#x27;model&#x27;) across 2 processes" in texts["html"]
    assert "P(None, 'model')" in texts["summary"], texts["summary"]
    assert "hidden=Linear(" in texts["treescope"], texts["treescope"]
    # replicated arrays are whole on every process: their statistics are shown
    assert "bias=f32[4](μ=" in texts["repr"], texts["repr"]
    assert "embed=#f32[32,8](μ=" in texts["repr"], texts["repr"]


def equality_names_the_leaf() -> None:
    model = state["trained"][0]
    other = jax.tree.map(lambda x: x + 0, model)  # equal values, new arrays
    for compare in (lambda: tc.is_tree_equal(model, other), lambda: model == other):
        try:
            compare()
        except ValueError as error:
            text = str(error)
            assert "Classifier.hidden.weight" in text, text
            assert "bool(jax.jit(tc.is_tree_equal)(a, b))" in text, text
        else:
            raise AssertionError("comparing spread arrays did not raise")
    # the fix from the message, run on every process
    assert bool(jax.jit(tc.is_tree_equal)(model, other))
    changed = model.at["head"]["bias"].apply(lambda b: b + 1)
    assert not bool(jax.jit(tc.is_tree_equal)(model, changed))
    # a replicated leaf is whole here: compared without the other processes
    assert tc.is_tree_equal({"b": model.head.bias}, {"b": other.head.bias})
    assert tc.is_tree_equal(model, model)  # the same tree: no value is read


def get_without_fill_names_the_leaf() -> None:
    model = state["trained"][0]
    positive = jax.tree.map(lambda x: x > 0, model)  # element masks, spread like the leaves
    try:
        model.at[positive].get()
    except ValueError as error:
        text = str(error)
        assert "Classifier.hidden.weight" in text and "fill_value=0" in text, text
    else:
        raise AssertionError("get of a spread element mask did not raise")
    kept = model.at[positive].get(fill_value=0)  # the fix: shape and sharding kept
    assert_placed(kept, jax.tree.map(lambda x: x.sharding, model))


def orbax_save() -> None:
    model, opt_state, key = state["trained"]
    save_checkpoint(CHECKPOINT, model, opt_state, key, step=1)
    multihost_utils.sync_global_devices("saved")
    leftovers = [p.name for p in CHECKPOINT.parent.iterdir() if "orbax-checkpoint-tmp" in p.name]
    assert not leftovers, leftovers
    try:
        if jax.process_index() == 0:
            write_expected()
    finally:
        multihost_utils.sync_global_devices("expected written")


def write_expected() -> None:
    """The one-device values after steps 1 and 2, for the restore runs to compare with."""
    expected = {}
    ref_model, ref_opt, ref_key, _ = state["reference_1"]
    for prefix, tree in (("model", ref_model), ("opt_state", ref_opt)):
        expected.update({prefix + k: np.asarray(v) for k, v in named_arrays(tree).items()})
    expected["key"] = np.asarray(jax.random.key_data(ref_key))
    model_2, _, _, loss_2 = state["reference_2"]
    expected.update({"next" + k: np.asarray(v) for k, v in named_arrays(model_2).items()})
    expected["next_loss"] = np.asarray(loss_2)
    np.savez(EXPECTED, **expected)


def restore_into_sharded_template() -> None:
    mesh = make_mesh()
    model, opt, opt_state, key, step = restore_checkpoint(CHECKPOINT, mesh)
    state.update(mesh=mesh, opt=opt, restored=(model, opt_state, key))
    shardings = model_shardings(model, mesh)
    expected = dict(np.load(EXPECTED))
    assert_tree_matches(model, expected, "model")
    assert_tree_matches(opt_state, expected, "opt_state")
    assert_placed(model, shardings)
    embed = tc.unfreeze(model.embed)
    assert embed.is_fully_replicated and embed.sharding == NamedSharding(mesh, P())
    assert type(tc.unfreeze(model.positions)) is np.ndarray
    assert (model.hidden.name, model.head.name) == ("hidden", "head")
    assert tc.unfreeze(model.act) is jax.nn.tanh
    assert_placed(opt_state, opt_shardings(opt_state, shardings, mesh))
    assert jnp.issubdtype(key.dtype, jax.dtypes.prng_key) and key.sharding.is_fully_replicated
    assert np.array_equal(jax.random.key_data(key), expected["key"])
    assert step == 1


def next_step_matches_one_device() -> None:
    model, opt_state, key = state["restored"]
    step = jax.jit(functools.partial(train_step, state["opt"]))
    model, _, _, loss = step(model, opt_state, key, *global_batch(2, state["mesh"]))
    expected = dict(np.load(EXPECTED))
    np.testing.assert_allclose(float(loss), float(expected["next_loss"]), rtol=1e-5)
    assert_tree_matches(model, expected, "next")


def tc_save_spread_arrays() -> None:
    """Replicated, held-whole-per-process and split-across-processes arrays, one file."""
    mesh, model = state["mesh"], state["trained"][0]
    rows = NamedSharding(mesh, P("data", None))  # split across the processes
    spread = jax.jit(lambda: jnp.arange(24.0).reshape(8, 3), out_shardings=rows)()
    key = jax.jit(lambda: jax.random.key(7), out_shardings=NamedSharding(mesh, P()))()
    split = NamedSharding(mesh, P("data"))
    keys = jax.jit(lambda: jax.random.split(jax.random.key(8), 4), out_shardings=split)()
    assert not spread.is_fully_addressable and not keys.is_fully_addressable
    save_with_tc(TC_CHECKPOINT, model)
    save_with_tc(SPREAD_CHECKPOINT, {"model": model, "spread": spread, "key": key, "keys": keys})
    # what the file holds, read without treeclass: every tensor, whole
    from safetensors.numpy import load_file

    saved = load_file(SPREAD_CHECKPOINT)
    expected = dict(np.load(EXPECTED))  # the one-device values after step 1
    for name in named_arrays(model):  # `['hidden']['weight']`: `model.hidden.weight`
        dotted = ".".join(re.findall(r"\['?([^'\]]+)'?\]", name))
        np.testing.assert_allclose(saved["model." + dotted], expected["model" + name], rtol=2e-5)
    np.testing.assert_array_equal(saved["spread"], np.arange(24.0).reshape(8, 3))
    np.testing.assert_array_equal(saved["key"], np.asarray(jax.random.key_data(jax.random.key(7))))
    four = jax.random.split(jax.random.key(8), 4)
    np.testing.assert_array_equal(saved["keys"], np.asarray(jax.random.key_data(four)))
    leftovers = [p.name for p in TC_CHECKPOINT.parent.iterdir() if p.name.endswith(".tmp")]
    assert not leftovers, leftovers


def tc_save_big_model() -> None:
    mesh = state["mesh"]
    rows = NamedSharding(mesh, P("data", None))
    big = jax.jit(build_big, out_shardings=rows)()  # frozen and static parts pass through
    assert not big.up.is_fully_addressable
    started = time.perf_counter()
    save_with_tc(BIG_CHECKPOINT, big)
    seconds = time.perf_counter() - started
    size = BIG_CHECKPOINT.stat().st_size
    print(f"figures: tc.save of {size} bytes took {seconds:.2f} s", file=sys.stderr)


SHARD_SIZE = f"{max(1, BIG_MB // 16)}MB"  # several shards of the mixed model
SHARDED_INDEX = pathlib.Path(FOLDER) / f"shared-{PROCESS_COUNT}" / "model.safetensors.index.json"


def mixed_model(mesh: jax.sharding.Mesh) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A few big tensors in every kind of sharding and many small replicated ones (and
    values only process 0's copy of counts), with what each must hold."""
    # every axis divisible by 2 processes x 2 devices and by 3 processes x 2 devices
    rows, cols = 12 * max(1, BIG_ROWS // 48), 12 * max(1, BIG_COLS // 48)
    grid = np.arange(rows)[:, None], np.arange(cols)[None, :]
    expected: dict[str, np.ndarray] = {
        "rows": pattern(*grid, 1.0),  # split by rows over the processes
        "cols": pattern(*grid, 2.0),  # split by columns over the processes (strided bytes)
        "inner": pattern(*grid, 3.0),  # split within each process, replicated over them
        "replicated": np.tile(pattern(*grid, 4.0), (3, 1)),  # the biggest: held by all
        "half": pattern(*grid, 5.0).astype(ml_dtypes.bfloat16),
    }
    expected.update({f"small.{i}": np.full(7 + i, i, "f4") for i in range(40)})
    specs = {
        "rows": P("data", None), "cols": P(None, "data"), "inner": P(None, "model"),
        "replicated": P(), "half": P("data", "model"),
    }  # fmt: skip
    tree: dict[str, Any] = {}
    for name, value in expected.items():
        sharding = NamedSharding(mesh, specs.get(name, P()))
        tree[name] = jax.make_array_from_callback(value.shape, sharding, lambda i, v=value: v[i])
    split, count = NamedSharding(mesh, P("data")), 2 * PROCESS_COUNT
    tree["keys"] = jax.jit(
        lambda: jax.random.split(jax.random.key(3), count), out_shardings=split
    )()
    expected["keys"] = np.asarray(jax.random.key_data(jax.random.split(jax.random.key(3), count)))
    tree["host"] = np.arange(10.0, dtype="f4")  # NumPy: process 0's value is saved
    expected["host"] = np.arange(10.0, dtype="f4")
    return tree, expected


def tc_sharded_save_is_written_by_every_process() -> None:
    from safetensors.numpy import load_file

    from treeclass._checkpoint.files._files import IO

    mesh = make_mesh()
    tree, expected = mixed_model(mesh)
    if jax.process_index() == 0:
        SHARDED_INDEX.parent.mkdir(exist_ok=True)
    multihost_utils.sync_global_devices("folder made")
    tracemalloc.start()
    IO.reset()
    tc.save(SHARDED_INDEX, tree, max_shard_size=SHARD_SIZE)
    written, peak = IO.written_bytes, tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    every = multihost_utils.process_allgather(np.array([written], np.int64)).reshape(-1)
    files = sorted(p for p in SHARDED_INDEX.parent.iterdir())
    assert not [p.name for p in files if p.name.endswith(".tmp")], files
    total = sum(p.stat().st_size for p in files)
    tensor_bytes = sum(v.nbytes for v in expected.values())
    print(
        f"figures: sharded tc.save of {tensor_bytes} tensor bytes in {len(files) - 1} shards: "
        f"bytes written per process {every.tolist()} (total/P {total / PROCESS_COUNT:.0f}), "
        f"host memory peak {peak} bytes on process {jax.process_index()}",
        file=sys.stderr,
    )
    assert len(files) > 3, files
    assert every.sum() == total, (every, total)  # every byte written once, by someone
    assert every.max() <= 1.1 * total / PROCESS_COUNT, (every, total)
    assert peak < tensor_bytes / 2, (peak, tensor_bytes)  # no process stages the model
    # an ordinary sharded safetensors folder: the reference reader reads every shard
    index = json.loads(SHARDED_INDEX.read_text())
    read: dict[str, np.ndarray] = {}
    for shard in sorted(set(index["weight_map"].values())):
        read.update(load_file(SHARDED_INDEX.parent / shard))
    assert sorted(read) == sorted(index["weight_map"]) == sorted(expected)
    for name, want in expected.items():
        got = read[name]
        assert got.dtype == want.dtype and got.shape == want.shape, (name, got.dtype)
        np.testing.assert_array_equal(got.view("u1"), want.view("u1"), err_msg=name)
    # and loads back into the same shardings
    # (a key array spread over processes is not yet restorable in place: this process's)
    mine = jax.random.split(jax.random.key(0), len(expected["keys"]))
    restored = tc.load(SHARDED_INDEX, {**tree, "keys": mine})
    for name, want in expected.items():
        value = restored[name]
        if name == "keys":
            value = jax.random.key_data(value)
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(value, want, err_msg=name)
            continue
        assert name == "keys" or value.sharding == tree[name].sharding, name
        for shard in value.addressable_shards:
            got = np.asarray(shard.data).view("u1")
            np.testing.assert_array_equal(got, want[shard.index].view("u1"), err_msg=name)


def a_failed_share_fails_the_sharded_save_everywhere() -> None:
    """A process that cannot write its share: the save fails on every process, naming
    it, and leaves the previous checkpoint exactly as it was; the next save works."""
    from treeclass._checkpoint.files import _processes

    tree, _ = mixed_model(make_mesh())
    folder = SHARDED_INDEX.parent
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    multihost_utils.sync_global_devices("read before")
    saved = _processes.write_at

    def broken(*args: Any) -> None:
        raise OSError(errno.EIO, "simulated disk failure")

    if jax.process_index() == 1:
        _processes.write_at = broken
    try:
        tc.save(SHARDED_INDEX, tree, max_shard_size=SHARD_SIZE)  # a new token in every file
    except OSError as error:
        text = str(error)
    else:
        raise AssertionError("a save whose process 1 failed did not fail")
    finally:
        _processes.write_at = saved
    assert "simulated disk failure" in text, text
    if jax.process_index() != 1:
        assert "failed on process 1" in text, text
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    multihost_utils.sync_global_devices("checked after")
    tc.save(SHARDED_INDEX, tree, max_shard_size=SHARD_SIZE)  # the processes are still in step
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]


def host_trees_are_written_by_their_caller_alone() -> None:
    """A tree with nothing spread over processes: whoever calls tc.save writes it, alone."""
    folder = pathlib.Path(FOLDER) / "alone"
    if jax.process_index() == 0:
        folder.mkdir(exist_ok=True)
    multihost_utils.sync_global_devices("alone: folder made")
    mesh = state["mesh"]
    replicated = jax.jit(lambda: jnp.arange(4.0), out_shardings=NamedSharding(mesh, P()))()
    inner = jax.jit(lambda: jnp.ones((2, 4)), out_shardings=NamedSharding(mesh, P(None, "model")))()
    tree = {"w": np.arange(6.0).reshape(2, 3), "step": 3, "replicated": replicated, "inner": inner}
    tree["local"] = jnp.full(2, 7.0)  # on this process's first device only
    values = {"w": tree["w"], "step": 3, "replicated": np.arange(4.0, dtype="f4")}
    values.update(inner=np.ones((2, 4), "f4"), local=np.full(2, 7.0, "f4"))

    def assert_saved(path: pathlib.Path) -> None:  # read back whole, as NumPy
        assert tc.is_tree_equal(tc.load(path, values), values), path

    for alone in (0, 1):
        path = folder / f"from-{alone}.safetensors"
        try:
            if jax.process_index() == alone:  # the other one waits at the barrier below
                tc.save(path, tree, timeout=5)  # (a bound, in case it waited after all)
                assert_saved(path)
        finally:
            multihost_utils.sync_global_devices(f"alone {alone}")
        assert_saved(path)  # a shared folder: both see it
    save_on_one_process(folder / "habit.safetensors", tree)
    multihost_utils.sync_global_devices("alone: the habit")
    assert_saved(folder / "habit.safetensors")
    # a file per process, and one path from every process: each writes its own copy
    mine = {"who": np.full(3, jax.process_index(), np.int32)}
    own = folder / f"own-{jax.process_index()}.safetensors"
    tc.save(own, mine)
    assert tc.load(own, mine)["who"].tolist() == [jax.process_index()] * 3
    for _ in range(3):
        tc.save(folder / "every.safetensors", tree)
    multihost_utils.sync_global_devices("alone: saved by every process")
    assert_saved(folder / "every.safetensors")
    # a sharded save by one process
    index = folder / "sharded" / "model.safetensors.index.json"
    try:
        if jax.process_index() == 0:
            index.parent.mkdir()
            tc.save(index, tree, max_shard_size="40B", timeout=5)
    finally:
        multihost_utils.sync_global_devices("alone: sharded")
    assert_saved(index)
    assert len(list(index.parent.iterdir())) > 2  # shards and their index
    # an export to another layout (rules=) by one process, as the habit writes any host tree
    rules = [("model.{rest*}", "{rest}")]
    export = folder / "export.safetensors"
    try:
        if jax.process_index() == 0:
            # (`inner`, split over this process's devices only, is not readable whole
            # through NumPy, which an export reads with; see the spread case for the error)
            readable = {k: v for k, v in tree.items() if k != "inner"}
            tc.save(export, readable, rules=rules, timeout=5)
    finally:
        multihost_utils.sync_global_devices("alone: export")
    expected = {k: v for k, v in values.items() if k != "inner"}
    assert tc.is_tree_equal(tc.load(export, expected, rules=rules), expected), export
    assert not [p.name for p in folder.rglob("*.tmp")]


def save_on_one_process(path: pathlib.Path, tree: Any) -> None:
    # a tree with nothing spread over processes (NumPy, replicated or local arrays):
    # the process that calls tc.save writes it alone, without waiting for the others
    if jax.process_index() == 0:
        tc.save(path, tree)


def spread_trees_need_every_process() -> None:
    """A tree with arrays split across processes: a call on one process, or calls with
    other trees or paths, end in a clear error on every process that made one, within
    the bound, and write nothing; the processes stay in step."""
    folder = pathlib.Path(FOLDER) / "spread"
    if jax.process_index() == 0:
        folder.mkdir(exist_ok=True)
    path = folder / "spread.safetensors"
    rows = np.arange(16.0, dtype="f4").reshape(4, 4)
    spread, by_columns = (
        jax.make_array_from_callback(rows.shape, NamedSharding(state["mesh"], s), lambda i: rows[i])
        for s in (P("data", None), P(None, "data"))
    )
    tree = {"host": np.arange(3.0), "spread": spread}
    rule = "every process must call tc.save with the same tree"
    notices: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: notices.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("treeclass").addHandler(handler)
    for alone in (0, 1):
        try:
            if jax.process_index() == alone:
                try:
                    tc.save(path, tree, timeout=0.25)
                except TimeoutError as error:
                    text = str(error)
                else:
                    raise AssertionError("a save of a spread tree on one process did not fail")
                assert rule in text and "['spread']" in text, text
                assert f"waited 0.25 s for process {1 - alone}" in text, text
                assert "a larger timeout=" in text, text
                # and it said so while it waited (after 10 s, or half the timeout)
                assert len(notices) == 1, notices
                assert f"is waiting for process {1 - alone}" in notices.pop(), notices
        finally:
            multihost_utils.sync_global_devices(f"spread alone {alone}")
    logging.getLogger("treeclass").removeHandler(handler)
    # an export to another layout is its caller's alone: a spread array is refused at once
    try:
        tc.save(path, tree, rules=[("model.{rest*}", "{rest}")], timeout=0.25)
    except ValueError as error:
        assert "tree['spread']" in str(error) and "gather it first" in str(error), error
    else:
        raise AssertionError("an export of a spread tree did not fail")
    assert sorted(p.name for p in folder.iterdir()) == [], list(folder.iterdir())
    # different trees or paths: the first key path where they differ, on every process
    cases = [
        ({**tree, "extra": np.ones(2)}, path, "['host'] on process 0, where process 1's tree has"),
        ({**tree, "host": np.arange(3.0, dtype="f4")}, path, "float64[3] on process 0, float32[3]"),
        ({**tree, "spread": by_columns}, path, "sharded P('data', None)"),
        (tree, folder / "other.safetensors", "process 0 saves to"),
    ]  # fmt: skip
    for other, where, difference in cases:
        try:
            if jax.process_index() == 0:
                tc.save(path, tree, timeout=5)
            else:
                tc.save(where, other, timeout=5)
        except ValueError as error:
            text = str(error)
            assert rule in text and difference in text and "process 1" in text, text
        else:
            raise AssertionError(f"calls with different trees were not refused: {difference}")
    assert sorted(p.name for p in folder.iterdir()) == [], list(folder.iterdir())
    # process 0 failing to write: the same failure on every process, not a wait
    try:
        tc.save(folder / "no such folder" / "x.safetensors", tree, timeout=5)
    except OSError as error:
        assert "no such folder" in str(error) and "does not exist" in str(error), error
    else:
        raise AssertionError("a save into a missing folder did not fail")
    # and the processes are still in step: the next save on all of them works
    tc.save(path, tree, timeout=5)
    restored = tc.load(path, {"host": np.zeros(3), "spread": np.zeros((4, 4), "f4")})
    np.testing.assert_array_equal(restored["spread"], rows)


def a_process_that_dies_mid_save_ends_the_others_waits() -> None:
    """The last process dies while it writes its share of a sharded save: the others
    raise within the bound, naming it, and the previous checkpoint stays as it was."""
    from treeclass._checkpoint.files import _processes

    tree, _ = mixed_model(make_mesh())
    folder = SHARDED_INDEX.parent
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    multihost_utils.sync_global_devices("before a death")
    victim = jax.process_count() - 1
    if jax.process_index() == victim:

        def die(*args: Any) -> None:
            os._exit(DIED)  # no cleanup, no goodbye: as a killed process

        _processes.write_at = die
    try:
        tc.save(SHARDED_INDEX, tree, max_shard_size=SHARD_SIZE, timeout=2)
    except TimeoutError as error:
        text = str(error)
    else:
        raise AssertionError("a save whose process died did not fail")
    assert f"for process {victim} to finish its share" in text, text
    assert "a larger timeout=" in text, text
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


DIED = 17  # the exit status of the process that dies on purpose


def bytes_read() -> tuple[int, int]:
    """This process's `rchar` (bytes passed to read calls) and `read_bytes` (from disk)."""
    fields = dict(
        line.split(": ") for line in pathlib.Path("/proc/self/io").read_text().splitlines()
    )
    return int(fields["rchar"]), int(fields["read_bytes"])


def tc_load_into_sharded_template() -> None:
    mesh = make_mesh()
    model = load_with_tc(TC_CHECKPOINT, mesh)
    expected = dict(np.load(EXPECTED))
    assert_tree_matches(model, expected, "model")
    assert_placed(model, model_shardings(model, mesh))
    embed = tc.unfreeze(model.embed)
    assert embed.is_fully_replicated and embed.sharding == NamedSharding(mesh, P())
    assert type(tc.unfreeze(model.positions)) is np.ndarray
    assert (model.hidden.name, model.head.name) == ("hidden", "head")
    assert tc.unfreeze(model.act) is jax.nn.tanh


def tc_load_reads_only_own_shards() -> None:
    from treeclass._checkpoint.files._files import IO
    from treeclass._checkpoint.files._processes import OVER_READ

    mesh = make_mesh()
    abstract = jax.eval_shape(build_big)
    size = BIG_CHECKPOINT.stat().st_size
    for spec in (P("data", None), P(None, "data"), P("data", "model")):
        # saved split by rows; loaded by rows, by columns, and by blocks
        sharding = NamedSharding(mesh, spec)
        template = with_shardings(abstract, jax.tree.map(lambda _, s=sharding: s, abstract))
        before, disk_before = bytes_read()
        IO.reset()
        started = time.perf_counter()
        big = tc.load(BIG_CHECKPOINT, template)
        seconds = time.perf_counter() - started
        read, disk = bytes_read()[0] - before, bytes_read()[1] - disk_before
        print(
            f"figures: tc.load {spec} on process {jax.process_index()} of {PROCESS_COUNT}: "
            f"rchar {read} of {size} bytes ({read / size:.3f}), read_bytes {disk}, "
            f"{IO.reads} reads of {IO.read_bytes} tensor bytes, {seconds:.2f} s",
            file=sys.stderr,
        )
        assert_big(big)
        assert big.up.sharding == sharding
        share = 1 / PROCESS_COUNT  # each process holds this much of each matrix
        needed = share * 2 * BIG_ROWS * BIG_COLS * 4 + BIG_COLS * 4  # and all of `norm`
        # a band of columns: its rows read together, with the bytes between them
        assert IO.read_bytes <= OVER_READ * needed, (spec, IO.read_bytes, needed)
        assert IO.reads <= 8, (spec, IO.reads)  # not one read per row
        if spec == P(None, "data"):
            assert read < min(OVER_READ * share + 0.2, 1.2) * size, (spec, read, size)
        else:
            assert read < (share + 0.2) * size, (spec, read, size)
            assert IO.read_bytes <= needed, (spec, IO.read_bytes, needed)


# -- sharding rules: the transformer of docs/recipes/sharding.md on many processes ----------------

RULES_CHECKPOINT = pathlib.Path(FOLDER) / "rules.safetensors"


ROOT_DIR = pathlib.Path(__file__).resolve().parents[1]


def sharding_page() -> dict[str, Any]:
    from multidevice import page_definitions

    page = ROOT_DIR / "docs" / "recipes" / "sharding.md"
    return page_definitions(page, "## A transformer and its rule table")


def rules_setup() -> None:
    """The page's model, rule table and deployments; the one-device reference step."""
    page = sharding_page()
    transformer, rules = page["Transformer"], page["RULES"]
    tensor = rules.with_axes(heads="model", mlp="model", vocab="model")
    state.update(
        page=page,
        fsdp=rules.with_axes(embed="data"),
        both=tensor.with_axes(embed="data"),
        # FSDP over every device of every process; `data` across, `model` within
        mesh_all=jax.make_mesh((jax.device_count(),), ("data",), axis_types=(AxisType.Auto,)),
        mesh=make_mesh(),
    )
    with jax.default_device(jax.local_devices()[0]):
        # built in one program (as `rules.init` builds it): op by op costs a compile each
        model = jax.jit(transformer)(jax.random.key(0))
        opt = tc.optim.trainable(optax.adamw(1e-2), model)
        step = jax.jit(functools.partial(rules_train_step, opt))
        stepped, _, loss = step(model, opt.init(model), jnp.asarray(rules_tokens()))
    state["rules_reference"] = (model, stepped, loss)


def rules_tokens() -> np.ndarray:
    return np.random.default_rng(7).integers(0, 64, (8, 9))


def rules_train_step(opt: Any, model: Any, opt_state: Any, tokens: Any) -> tuple[Any, ...]:
    loss, grads = jax.value_and_grad(state["page"]["loss_fn"])(model, tokens)
    updates, opt_state = opt.update(grads, opt_state, model)
    return optax.apply_updates(model, updates), opt_state, loss


def assert_like(tree: Any, reference: Any) -> None:
    """Each shard of each leaf this process holds equals the same slice of `reference`."""
    pairs = zip(
        jax.tree_util.tree_flatten_with_path(tree)[0], jax.tree.leaves(reference), strict=True
    )
    for (path, leaf), want in pairs:
        assert_matches(leaf, np.asarray(want), jax.tree_util.keystr(path))


def rules_init_in_place() -> None:
    transformer = state["page"]["Transformer"]
    abstract = jax.eval_shape(transformer, jax.random.key(0))
    reference = state["rules_reference"][0]
    for rules, mesh in ((state["fsdp"], state["mesh_all"]), (state["both"], state["mesh"])):
        model = rules.init(mesh, transformer, jax.random.key(0))
        assert_placed(model, rules.shardings(abstract, mesh))
        assert_like(model, reference)
        weight = model.blocks.tree.up.weight
        assert not weight.is_fully_addressable  # spread over both processes
        local = sum(s.data.size for s in weight.addressable_shards)
        assert local == weight.size // PROCESS_COUNT, (local, weight.size)
    state["rules_model"] = model  # the last: FSDP and tensor parallel on the 2-d mesh


def rules_train_step_keeps_shardings() -> None:
    rules, mesh, model = state["both"], state["mesh"], state["rules_model"]
    opt = tc.optim.trainable(optax.adamw(1e-2), model)
    opt_state = tc.init_like(opt.init, model)  # the state placed like the model
    shardings = rules.shardings(
        jax.eval_shape(state["page"]["Transformer"], jax.random.key(0)), mesh
    )
    state_shardings = tc.shardings_like(opt_state, shardings)
    assert_placed(opt_state, state_shardings)
    step = jax.jit(
        functools.partial(rules_train_step, opt), out_shardings=(shardings, state_shardings, None)
    )
    rows = NamedSharding(mesh, P("data"))
    batch = rules_tokens()
    tokens = jax.make_array_from_callback(batch.shape, rows, lambda index: batch[index])
    model, opt_state, loss = step(model, opt_state, tokens)
    assert_placed(model, shardings)
    assert_placed(opt_state, state_shardings)
    _, ref_model, ref_loss = state["rules_reference"]
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
    assert_like(model, ref_model)
    state["rules_trained"] = model


def rules_tc_load_into_template() -> None:
    model = state["rules_trained"]
    save_with_tc(RULES_CHECKPOINT, model)  # every process: process 0 writes
    abstract = jax.eval_shape(state["page"]["Transformer"], jax.random.key(0))
    fsdp, mesh_all = state["fsdp"], state["mesh_all"]  # another layout than the saved one
    restored = tc.load(RULES_CHECKPOINT, fsdp.template(abstract, mesh_all))
    assert_placed(restored, fsdp.shardings(abstract, mesh_all))
    assert_like(restored, state["rules_reference"][1])


def rules_misfit_refused_on_every_process() -> None:
    transformer = state["page"]["Transformer"]
    live = len(jax.live_arrays())
    try:  # 2 blocks split over every device of both processes
        state["page"]["RULES"].with_axes(layers="data").init(
            state["mesh_all"], transformer, jax.random.key(0)
        )
    except ValueError as error:
        text = str(error)
        assert "`Transformer.blocks.up.weight` f32[2,32,64] (stacked: 2 blocks" in text, text
    else:
        raise AssertionError("a block axis of 2 split over 4 devices was not refused")
    assert len(jax.live_arrays()) == live
    multihost_utils.sync_global_devices("misfit refused")  # and the processes are in step


SCENARIOS: dict[str, list[Callable[[], None]]] = {
    "train_and_save": [
        one_device_run,
        init_in_shardings,
        train_step_matches_one_device,
        frozen_values_work_in_jit,
        freezing_a_spread_array_is_refused,
        inspection_from_one_process,
        equality_names_the_leaf,
        get_without_fill_names_the_leaf,
        orbax_save,
        tc_save_spread_arrays,
        tc_save_big_model,
        tc_sharded_save_is_written_by_every_process,
        host_trees_are_written_by_their_caller_alone,
        spread_trees_need_every_process,
    ],
    "sharding_rules": [
        rules_setup,
        rules_init_in_place,
        rules_train_step_keeps_shardings,
        rules_tc_load_into_template,
        rules_misfit_refused_on_every_process,
    ],
    "sharded_save": [
        tc_sharded_save_is_written_by_every_process,
        a_failed_share_fails_the_sharded_save_everywhere,
        a_process_that_dies_mid_save_ends_the_others_waits,  # last: a process dies
    ],
    "restore": [
        restore_into_sharded_template,
        next_step_matches_one_device,
        tc_load_into_sharded_template,
        tc_load_reads_only_own_shards,
    ],
}


# the two scenarios of the same processes and mesh in one run (the test's): a start of
# two processes, their imports and their `jax.distributed` set-up saved
SCENARIOS["train_and_save+sharding_rules"] = [
    *SCENARIOS["train_and_save"],
    *SCENARIOS["sharding_rules"],
]
ENDS_WITH_A_DEATH = {"sharded_save"}


def main() -> None:
    results: dict[str, str] = {}
    for check in SCENARIOS[SCENARIO]:
        name = check.__name__
        print(
            f"start: {name} at {time.perf_counter() - STARTED:.1f} s", file=sys.stderr, flush=True
        )
        try:
            check()
            results[name] = "ok"
        except Exception:
            results[name] = traceback.format_exc(limit=6)
        print(f"done: {name}: {results[name]}", file=sys.stderr, flush=True)
        print(json.dumps(results), flush=True)  # so far: what a process that dies reported
    print(f"all done at {time.perf_counter() - STARTED:.1f} s", file=sys.stderr, flush=True)
    if SCENARIO in ENDS_WITH_A_DEATH:  # the runtime's goodbye would wait for the dead one
        os._exit(0)


if __name__ == "__main__":
    main()
