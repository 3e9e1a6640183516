"""Printing arrays sharded over 8 CPU devices; run by tests/test_pprint.py in a subprocess.

The device count is fixed when jax is imported, hence a separate process. Every check
counts the arrays the printers copy to the host (their one seam, `_pprint.to_host`): a
sharded array must only ever be read shard by shard, never gathered whole. The last
stdout line is a JSON object: check name -> "ok" or the failure's traceback.
"""

from __future__ import annotations

import os
import pathlib
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# this checkout's treeclass, not an installed one (the subprocess has no pytest path)
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import contextlib  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from multidevice import report  # noqa: E402

import treeclass as tc  # noqa: E402
from treeclass import _pprint  # noqa: E402


@contextlib.contextmanager
def host_copies() -> Iterator[list[tuple[int, ...]]]:
    """The shapes of the arrays the printers copy to the host while the block runs."""
    shapes: list[tuple[int, ...]] = []
    real = _pprint.to_host

    def counting(x):
        shapes.append(tuple(np.shape(x)))
        return real(x)

    _pprint.to_host = counting
    try:
        yield shapes
    finally:
        _pprint.to_host = real


def sharded(values: np.ndarray, spec: P) -> jax.Array:
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    return jax.device_put(values, NamedSharding(mesh, spec))


def check_small_sharded_arrays_print_exact_statistics_shard_by_shard() -> None:
    values = np.arange(64 * 32, dtype=np.float32).reshape(64, 32)
    x = sharded(values, P("data", "model"))
    with host_copies() as shapes:
        text = tc.tree_repr({"w": x})
    assert text == tc.tree_repr({"w": values}), text
    assert shapes and all(shape == (16, 16) for shape in shapes), shapes


def check_replicated_shards_are_read_once() -> None:
    x = sharded(np.ones((8, 4), np.float32), P("data", None))  # 2 replicas of each shard
    with host_copies() as shapes:
        tc.tree_repr(x)
    assert shapes == [(2, 4)] * 4, shapes


def check_large_sharded_arrays_show_sampled_statistics_without_a_gather() -> None:
    values = np.random.default_rng(0).normal(size=(512, 256)).astype(np.float32)
    x = sharded(values, P("data", "model"))
    saved = _pprint.STATS_EXACT_MAX
    _pprint.STATS_EXACT_MAX = 1000  # 131,072 elements is then "large"
    try:
        with host_copies() as shapes:
            text = tc.tree_repr(x)
    finally:
        _pprint.STATS_EXACT_MAX = saved
    assert text.startswith("f32[512,256](sampled μ=") and "σ=1.0" in text, text
    assert all(shape == (128, 128) for shape in shapes), shapes


def check_str_of_a_large_sharded_array_reads_only_its_corners() -> None:
    values = np.arange(200 * 120, dtype=np.float32).reshape(200, 120)
    x = sharded(values, P("data", "model"))
    with host_copies() as shapes:
        text = tc.tree_str(x)
    assert text == str(values), text
    assert all(shape == (50, 60) for shape in shapes), shapes
    sliced = np.ix_(np.r_[0:3, 3, 197:200], np.r_[0:3, 3, 117:120])
    assert np.array_equal(_pprint._corners(x), values[sliced])


def check_summary_and_diagram_of_a_sharded_model_do_not_gather() -> None:
    model = {"w": sharded(np.ones((64, 32), np.float32), P("data", "model")), "b": jnp.ones(3)}
    with host_copies() as shapes:
        tc.tree_diagram(model)
        tc.tree_summary(model)
        tc.tree_str(model)
    assert (64, 32) not in shapes, shapes


CHECKS: dict[str, Callable[[], None]] = {
    name.removeprefix("check_"): fn for name, fn in globals().items() if name.startswith("check_")
}

if __name__ == "__main__":
    report(CHECKS, limit=6)
