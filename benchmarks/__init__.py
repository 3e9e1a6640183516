"""The treeclass benchmark suite: `python -m benchmarks`.

It times what a TreeClass costs on the paths users care about (flattening, `jax.jit`
dispatch, a training step, `.at` edits, frozen leaves, construction, leafwise operators)
against plain dict/list parameters (the floor) and the peers that are installed:
a `jax.tree_util.register_dataclass` dataclass, `flax.struct.PyTreeNode`,
`equinox.Module`, pytreeclass and sepes. Peers are imported lazily and skipped with a
note when missing.

Layout, one concept per module:

- `timing`: interleaved, shuffled rounds and the median of per-round ratios;
- `peers`: one adapter ("kit") per implementation, building the same models;
- `probes`: which treeclass features are ready (a case needing a missing one is skipped);
- `cases`: the benchmark cases, their correctness checks and the DESIGN.md targets;
- `runner`: checks, then times, every case;
- `report`: the header, the Markdown tables, JSON and the PNG plot;
- `cli`: the command line (`python -m benchmarks --help`).

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

    The exit status: 0 on success, 1 when an implementation gave wrong numbers,
    2 for bad arguments.
    """
    from .cli import main as _main

    return _main(argv)
