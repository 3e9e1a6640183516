"""The whole suite's cases, in report order: one list built from every case module.

The case modules (`cases`, `nn`, `sharding`, `stacked`, `finetune`, `transformer`) import
the `Case` vocabulary from `cases`; this module alone imports them all, so no two of
them import each other.
"""

from __future__ import annotations

import jax

from .cases import FULL_SIZES, Case, Sizes, core_cases
from .finetune import finetune_cases, finetune_grads_cases
from .nn import nn_cases
from .sharding import sharding_cases
from .stacked import periodic_cases, stacked_cases
from .transformer import compute_bound_case, gpt_size, transformer_case

__all__ = ["all_cases"]


def all_cases(sizes: Sizes = FULL_SIZES) -> list[Case]:
    """Every case, in report order, for the given model sizes.

    **Arguments**

    - `sizes`: `FULL_SIZES` (the suite), or `SMOKE_SIZES` (the tests).

    **Returns**

    A list of `Case`; building it imports no peer.

    ```python
    from benchmarks.cases import SMOKE_SIZES
    from benchmarks.suite import all_cases

    names = [case.name for case in all_cases(SMOKE_SIZES)]
    assert "dispatch_2_layers" in names
    ```
    """
    backend = "cpu" if sizes.gpt == "smoke" else jax.default_backend()
    return [
        transformer_case(gpt_size(sizes.gpt, backend, sizes.gpt_batch)),
        *([compute_bound_case()] if sizes.gpt != "smoke" else []),
        *nn_cases(sizes),  # beside the workload case, in its group
        *core_cases(sizes),
        *sharding_cases(sizes),
        *stacked_cases(sizes),
        *periodic_cases(sizes),
        *finetune_cases(sizes),
        *finetune_grads_cases(sizes),
    ]
