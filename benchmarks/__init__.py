"""The treeclass benchmark suite: `python -m benchmarks`.

It times what a TreeClass costs on the paths users care about (a real training loop,
flattening, `jax.jit` dispatch, a training step, `.at` edits, frozen leaves,
construction, `replace`, leafwise operators, checkpoints, a deep model of stacked
blocks) against plain dict/list parameters (the floor) and the peers that are installed:
a `jax.tree_util.register_dataclass` dataclass, `flax.struct.PyTreeNode`, `flax.nnx`,
`equinox.Module`, pytreeclass and sepes (and, for checkpoints, safetensors, NumPy and
orbax). It also measures how each cost grows with the number of layers. Peers are
imported lazily and skipped with a note when missing.

Layout, one concept per module:

- `timing`: interleaved, shuffled rounds and the median of per-round ratios;
- `stats`: bootstrap intervals, the met / missed / within-noise verdict, scaling fits;
- `peers`: one adapter ("kit") per implementation, building the same models;
- `probes`: which treeclass features are ready (a case or row needing a missing one is
  skipped or marked "not available");
- `cases`: the benchmark cases, their correctness checks and their speed targets (the
  targets of docs/architecture.md);
- `workload`: the training loop with real compute (steps per second);
- `checkpoint`: saving and loading a 1 GiB model, and each save's peak memory;
- `foreign`: loading a PyTorch-style safetensors file through key rules, and its memory;
- `hfsharded`: loading a sharded checkpoint in Hugging Face's layout (per-layer keys,
  several shards written by `safetensors`) through key rules, and its memory;
- `stacked`: a model of N identical blocks, stacked and scanned or unrolled (compile,
  step, initialisation);
- `scaling`: each operation at 10 to 10,000 layers (the stacked compile at 12 to 96
  blocks) and its fitted exponent;
- `runner`: checks, then times, every case; re-measures verdicts within noise;
- `report`: the header, JSON, and the Markdown rendered from that JSON;
- `plots`: the ratio plot and the log-log scaling plot;
- `publish`: rewrites the generated blocks of README.md and docs/performance.md;
- `cli`: the command line (`python -m benchmarks --help`).

See benchmarks/README.md for the flags, the modes and the command that regenerates the
published figures.

```python
from benchmarks.cli import main

main(["--smoke", "--only", "flatten_4"])   # returns 0; prints a small report
```
"""

from __future__ import annotations

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run the suite with command-line arguments `argv` (see `python -m benchmarks --help`).

    **Arguments**

    - `argv`: the arguments, without the program name; `None` reads `sys.argv`.

    **Returns**

    The exit status: 0 on success, 1 when treeclass or the floor gave wrong numbers (a
    peer's wrong numbers are reported as the peer's), 2 for bad arguments.
    """
    from .cli import main as _main

    return _main(argv)
