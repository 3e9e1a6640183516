"""Shared test settings and models.

`strict_jax` runs a test with implicit rank promotion (`x + y` with shapes (3,) and
(2, 1)) as an error, and strict dtype promotion: modules whose code does not rely on
either (a bias added to a batch does) use it for every test with
`pytestmark = pytest.mark.usefixtures("strict_jax")`. Warnings are errors everywhere (see
pyproject.toml's `filterwarnings`).

On the CPU, tests compile with XLA's optimisations off (`jax_disable_most_optimizations`,
also passed to the child processes tests start): the suite compiles thousands of tiny
programs and runs most of them once, so optimising their machine code costs more than
running it unoptimised (about a third of the suite's time on 2 cores). What the tests
check, treeclass's trees and the numbers they compute, does not depend on it. An
accelerator keeps the compiler's defaults (its numerics follow them); an explicit
`JAX_DISABLE_MOST_OPTIMIZATIONS` (0 or 1) in the environment is left alone.

For the same reason XLA's CPU compiler emits its fused loops the older way
(`--xla_cpu_use_fusion_emitters=false` in `XLA_FLAGS`, also inherited by the child
processes): the newer emitters spend about three times longer compiling a small train step
(with them the suite took 846 s of CPU on 2 cores, with the older ones 591 s). The flag
is read by the CPU compiler alone (an accelerator's programs are untouched); one already in
`XLA_FLAGS` is left alone.
"""

from __future__ import annotations

import os
import sys

# Where the environment turns Python's bytecode cache off (PYTHONDONTWRITEBYTECODE, as
# container images often do), every process of a run, the two workers and the fifty-odd
# child processes tests start, compiles treeclass and the test helpers from source again
# (0.2 s of CPU a child), and pytest rewrites each test module's asserts again in each
# worker (about 7 s a worker on a second run). A test run caches them as Python does by
# default, in the `__pycache__` folders beside the sources (ignored by git); set before
# the workers and the children start, which inherit it.
if sys.dont_write_bytecode:
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False

# before JAX starts a backend: XLA reads its flags once, when the first client is made
if "xla_cpu_use_fusion_emitters" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = " ".join(
        [*os.environ.get("XLA_FLAGS", "").split(), "--xla_cpu_use_fusion_emitters=false"]
    )

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

import treeclass as tc  # noqa: E402

if "JAX_DISABLE_MOST_OPTIMIZATIONS" not in os.environ and jax.default_backend() == "cpu":
    os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] = "1"
    jax.config.update("jax_disable_most_optimizations", True)
if jax.default_backend() != "cpu":
    # this process holds the accelerator, which one process at a time may open: the child
    # processes tests start (imports, pickling, a notebook server) run on the CPU
    os.environ["JAX_PLATFORMS"] = "cpu"

# no time limit on a property test's example (hypothesis's default is 200 ms): a first
# example compiles, and a busy machine stretches it; a slow test shows in `--durations`
settings.register_profile("treeclass", deadline=None)
settings.load_profile("treeclass")


@pytest.fixture
def strict_jax():
    with jax.numpy_rank_promotion("raise"), jax.numpy_dtype_promotion("strict"):
        yield


class Linear(tc.TreeClass):
    """A dense layer with a static name: the model most tests need."""

    weight: jax.Array
    bias: jax.Array
    name: str = tc.field(default="linear", static=True)

    def __call__(self, x: jax.Array) -> jax.Array:
        return x @ self.weight + self.bias


class MLP(tc.TreeClass):
    """A stack of `Linear` layers built by a hand-written `__init__`."""

    def __init__(self, sizes: tuple[int, ...], key: jax.Array | None = None) -> None:
        key = jax.random.key(0) if key is None else key
        keys = jax.random.split(key, len(sizes) - 1)
        self.layers = tuple(
            Linear(jax.random.normal(k, (i, o)), jnp.zeros(o))
            for k, i, o in zip(keys, sizes[:-1], sizes[1:])
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        for layer in self.layers[:-1]:
            x = jax.nn.relu(layer(x))
        return self.layers[-1](x)


@pytest.fixture
def mlp() -> MLP:
    return MLP((3, 4, 2))


def _counts_bytes_read() -> bool:
    """Whether this machine's kernel counts a process's bytes read (`rchar` in
    /proc/self/io): Linux does, but some sandboxes give the file without it."""
    try:
        with open("/proc/self/io") as io:
            return any(line.startswith("rchar:") for line in io)
    except OSError:
        return False


# for the tests that check how many bytes a load reads
needs_read_counts = pytest.mark.skipif(
    not _counts_bytes_read(), reason="this machine does not count bytes read (/proc/self/io rchar)"
)


@pytest.fixture
def highest_precision():
    """Matrix products at full float32 precision, for comparisons with references at tight
    tolerances (the CPU's default already is; a TPU's default rounds inputs to bfloat16).
    Use it for a whole file with `pytestmark = pytest.mark.usefixtures("highest_precision")`."""
    with jax.default_matmul_precision("highest"):
        yield


def reference_tol(rtol: float = 1e-5, atol: float = 1e-5) -> dict[str, float]:
    """Tolerances for a comparison with a reference computed elsewhere (a float64 NumPy
    model, a peer library, the outputs recorded in a file): as given on a CPU; at least
    1e-4 on an accelerator, whose float32 exp, erf and tanh agree with a CPU's to four or
    five digits even at the highest matrix-product precision."""
    if jax.default_backend() == "cpu":
        return {"rtol": rtol, "atol": atol}
    return {"rtol": max(rtol, 1e-4), "atol": max(atol, 1e-4)}


def device_keeps_zero_sign(dtype) -> bool:
    """Whether the default backend keeps the sign of a zero of `dtype`: a TPU holds float64
    (and complex128) as pairs of float32 and places -0.0 as +0.0 (`jnp.asarray` alone
    loses it, before any treeclass code runs)."""
    lossy = {"tpu": ("float64", "complex128")}.get(jax.default_backend(), ())
    return np.dtype(dtype).name not in lossy


def device_holds(dtype) -> bool:
    """Whether the default backend can hold an array of `dtype`: a test that puts one there
    would end the whole run where it cannot (int2/uint2 on a TPU), so it keeps that dtype
    on the host. The table is the one `tc.load` refuses by."""
    from treeclass._checkpoint.names._restore import DEVICE_CANNOT_HOLD

    name = np.dtype(dtype).name
    return name not in DEVICE_CANNOT_HOLD.get(jax.default_backend(), frozenset())


# -- two workers that finish together (pytest-xdist, `-n 2 --dist loadfile`) ----------------
# A worker takes a whole file, so that a module's fixtures and compiled functions are built
# once. xdist hands out the files with most tests first; we hand out the longest first
# instead (the order below, from a profile of the suite's CPU time; then the order of
# collection), so that the short ones fill in at the end and both workers finish together:
# the longest files hold few tests (a benchmark run, processes started, type checkers).
# A wrong order costs time, never a result. (`--dist loadgroup` would split files, but it
# cannot with pytest 9, whose test ids xdist 3.8 no longer renames.)
_LONGEST_FIRST = (
    "test_benchmarks.py",
    "test_examples.py",
    "test_multihost.py",
    "test_typing.py",
    "test_nn.py",
    "test_nn_anchors.py",
    "test_stacked.py",
    "test_nn_families.py",
    "test_checkpoint.py",
    "test_reliability.py",
    "test_optim.py",
    "test_sharding.py",
    "test_checkpoint_hf.py",
    "test_roles.py",
    "test_transforms.py",
    "test_checkpoint_files.py",
    "test_checkpoint_formats.py",
    "test_pprint.py",
    "test_periodic.py",
    "test_checkpoint_rules.py",
    "test_numbers.py",
    "test_checkpoint_families.py",
    "test_pickling.py",
    "test_pprint_html.py",
    "test_leafwise.py",
    "test_kinds.py",
)


def pytest_configure(config: pytest.Config) -> None:
    if getattr(config.option, "loadscopereorder", None):  # xdist's order: ours instead
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(_LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: files keep order
