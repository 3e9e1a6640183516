"""Checkpoints of a model sharded over 8 CPU devices; run by tests/test_checkpoint.py.

A separate process because the device count is fixed when jax is imported, and because
orbax is slow to import. Each check saves a sharded model (with `tc.save` or orbax),
restores it into a sharded template and compares values, shardings, frozen and static
values; one check loads into templates sharded 15 ways, counting the bytes each load
reads. The last stdout line is a JSON object: check name -> "ok" or the traceback (for
that one, case -> "ok" or the traceback).
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pathlib  # noqa: E402
import tempfile  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from multidevice import report  # noqa: E402

import treeclass as tc  # noqa: E402


class Linear(tc.TreeClass):
    weight: jax.Array
    bias: jax.Array
    name: str = tc.field(default="linear", static=True)


class Model(tc.TreeClass):
    def __init__(self, key: jax.Array) -> None:
        k1, k2, k3 = jax.random.split(key, 3)
        self.embed = tc.freeze(jax.random.normal(k1, (16, 8)))  # a frozen table is data
        self.layers = (
            Linear(jax.random.normal(k2, (8, 16)), jnp.zeros(16) + 0.5),
            Linear(jax.random.normal(k3, (16, 8)), jnp.arange(8.0), name="out"),
        )
        self.act = tc.freeze(jax.nn.relu)  # a function: comes from the template
        self.kind = tc.freeze("classifier")  # a string: orbax cannot save it
        self.step = jnp.array(7)


def mesh() -> Mesh:
    return Mesh(np.array(jax.devices()), ("x",))


def sharding_for(path: tuple, shape: tuple) -> NamedSharding:
    """Rows over the 8 devices for the 2-d arrays, replicated for the rest."""
    return NamedSharding(mesh(), P("x", None) if len(shape) == 2 else P())


def with_shardings(tree: Any, make: Callable[[Any], Any]) -> Any:
    """`tree` with every array, frozen ones included, replaced by `make(path, array)`."""

    def place(path: tuple, x: Any) -> Any:
        if tc.is_frozen(x):
            inner = tc.unfreeze(x)
            return tc.freeze(make(path, inner)) if hasattr(inner, "shape") else x
        return make(path, x)

    return jax.tree_util.tree_map_with_path(place, tree, is_leaf=tc.is_frozen)


def sharded_model() -> Model:
    model = Model(jax.random.key(0))
    return with_shardings(model, lambda p, x: jax.device_put(x, sharding_for(p, x.shape)))


def sharded_template() -> Any:
    abstract = jax.eval_shape(lambda: Model(jax.random.key(1)))
    return with_shardings(
        abstract,
        lambda p, x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding_for(p, x.shape)),
    )


def assert_restored(restored: Any, model: Model) -> None:
    """Every array bit-identical and sharded as in `model`; frozen and static values kept."""
    assert jax.tree_util.tree_structure(restored) == jax.tree_util.tree_structure(model)
    pairs = zip(
        jax.tree_util.tree_leaves(tc.tree_unmask(restored)),
        jax.tree_util.tree_leaves(tc.tree_unmask(model)),
    )
    for got, want in pairs:
        if not hasattr(want, "shape"):  # the function itself, or an equal string
            assert got is want or (type(got) is str and got == want), (got, want)
            continue
        assert isinstance(got, jax.Array), type(got)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert np.array_equal(np.asarray(got), np.asarray(want))
        assert got.sharding.is_equivalent_to(want.sharding, got.ndim), (got.sharding, want)
    embed = tc.unfreeze(restored.embed)
    assert len(embed.addressable_shards) == 8 and embed.addressable_shards[0].data.shape == (2, 8)
    assert tc.unfreeze(restored.act) is jax.nn.relu
    assert tc.unfreeze(restored.kind) == "classifier"
    assert restored.layers[1].name == "out"


# ------------------------------------------------------------------------------------------

CHECKS: dict[str, Callable[[], object]] = {}


def check(fn: Callable[[], object]) -> Callable[[], object]:
    CHECKS[fn.__name__] = fn
    return fn


@check
def eight_devices() -> None:
    assert len(jax.devices()) == 8, jax.devices()


def _bytes_read() -> int:
    text = pathlib.Path("/proc/self/io").read_text()
    return int(dict(line.split(": ") for line in text.splitlines())["rchar"])


@check  # before the orbax checks: nothing else of this process reads files meanwhile
def sharded_load_reads_each_byte_once() -> dict[str, str]:
    """`tc.load` into templates sharded 15 ways: each case's outcome (the bytes it read
    counted by the kernel: a test skips where /proc/self/io has no `rchar`)."""
    mesh = jax.make_mesh((2, 4), ("a", "b"))
    rng = np.random.default_rng(0)
    values = {
        "f32": rng.normal(size=(8, 16, 12)).astype("f4"),
        "bf16": rng.normal(size=(16, 8)).astype(jnp.bfloat16),
        "i8": rng.integers(-100, 100, (8, 4)).astype("i1"),
        "mask": rng.normal(size=(8, 4)) > 0,  # bool: read whole (its bits are checked)
        "tall": rng.normal(size=(40000, 4)).astype("f4"),  # columns of many rows
        "scalar": np.float32(3.5),
    }
    specs = {
        "f32": [P("a"), P(None, "b"), P(None, None, "b"), P("a", "b"), P(), P(("a", "b"))],
        "bf16": [P("b"), P(None, "b"), P("a", "b")],
        "i8": [P(None, "b"), P("b")],
        "mask": [P("a", "b")],
        "tall": [P(None, "b"), P("b", "a")],
        "scalar": [P()],
    }
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "m.safetensors")
        tc.save(path, {k: jnp.asarray(v) for k, v in values.items()})
        size = os.path.getsize(path)
        for name, value in values.items():
            for spec in specs[name]:
                key = f"{name} {spec}"
                try:
                    sharding = NamedSharding(mesh, spec)
                    like = {k: jnp.zeros(v.shape, v.dtype) for k, v in values.items()}
                    like[name] = jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=sharding)
                    before = _bytes_read()
                    got = tc.load(path, like, where=name)[name]  # the others are not read
                    read = _bytes_read() - before
                    assert got.sharding == sharding, (got.sharding, sharding)
                    np.testing.assert_array_equal(np.asarray(got), value)
                    for shard in got.addressable_shards:
                        np.testing.assert_array_equal(np.asarray(shard.data), value[shard.index])
                    # every byte of the tensor once (all 8 devices are this process's), not
                    # once per device; a little more for the header
                    assert value.nbytes <= read < value.nbytes + 3 * 4096 + size // 4, (
                        read,
                        value.nbytes,
                    )
                    results[key] = "ok"
                except Exception:
                    results[key] = traceback.format_exc()
    return results


@check
def orbax_round_trip_with_an_abstract_sharded_template() -> None:
    import orbax.checkpoint as ocp

    model = sharded_model()
    like = sharded_template()
    with tempfile.TemporaryDirectory() as folder:
        checkpointer = ocp.StandardCheckpointer()
        checkpointer.save(os.path.join(folder, "step"), tc.state_dict(model))
        checkpointer.wait_until_finished()
        restored = checkpointer.restore(os.path.join(folder, "step"), tc.state_dict(like))
    assert_restored(tc.from_state_dict(like, restored), model)


@check
def orbax_restore_without_a_target_is_placed_like_the_template() -> None:
    import orbax.checkpoint as ocp

    model = sharded_model()
    with tempfile.TemporaryDirectory() as folder:
        checkpointer = ocp.StandardCheckpointer()
        checkpointer.save(os.path.join(folder, "step"), tc.state_dict(model))
        checkpointer.wait_until_finished()
        restored = checkpointer.restore(os.path.join(folder, "step"))  # keys "0", "1"
    assert_restored(tc.from_state_dict(sharded_template(), restored), model)


@check
def save_and_load_with_an_abstract_sharded_template() -> None:
    model = sharded_model()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "model.safetensors")
        tc.save(path, model)
        restored = tc.load(path, sharded_template())
    assert_restored(restored, model)


@check
def load_into_a_sharded_model_keeps_its_shardings() -> None:
    model = sharded_model()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "model.safetensors")
        tc.save(path, model)
        like = with_shardings(
            Model(jax.random.key(2)),
            lambda p, x: jax.device_put(x, sharding_for(p, x.shape)),
        )
        restored = tc.load(path, like)
    assert_restored(restored, model)


if __name__ == "__main__":
    report(CHECKS, limit=8)
