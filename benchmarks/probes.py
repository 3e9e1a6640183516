"""Which treeclass features work yet: a case that needs a missing one is skipped, not crashed.

Each probe runs the feature once on a two-layer tree and checks the numbers, so a
half-built feature (one that returns without error but gives a wrong tree) counts as
missing too. Results are cached for the process.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from .peers import get_kit

__all__ = ["FEATURES", "probe"]


def _two_layers():
    kit = get_kit("treeclass")
    layers = [kit.linear(jnp.full((2, 2), float(i)), jnp.zeros(2)) for i in range(2)]
    return kit, kit.mlp(layers)


def _probe_at_path() -> None:
    kit, model = _two_layers()
    edited = kit.set_deep(model, 1, jnp.full((2, 2), 7.0))
    assert float(edited.layers[1].weight[0, 0]) == 7.0, "wrong value after .set"
    assert float(model.layers[1].weight[0, 0]) == 1.0, ".set changed its input"


def _probe_at_type() -> None:
    kit, model = _two_layers()
    edited = kit.apply_weights(model, lambda w: w + 1)
    assert float(edited.layers[0].weight[0, 0]) == 1.0, "wrong value after .apply"
    assert float(edited.layers[0].bias[0]) == 0.0, ".apply touched an unselected leaf"


def _probe_at_mask() -> None:
    kit, model = _two_layers()
    mask = jax.tree_util.tree_map(lambda x: x > 0, model)
    edited = kit.mask_set(model, mask, -1.0)
    assert float(edited.layers[1].weight[0, 0]) == -1.0, "wrong value after .at[mask].set"
    assert float(edited.layers[0].weight[0, 0]) == 0.0, ".at[mask].set touched a False"


def _probe_at_mask_jit() -> None:
    kit, model = _two_layers()
    mask = jax.tree_util.tree_map(lambda x: x > 0, model)
    edited = jax.jit(kit.mask_set)(model, mask, -1.0)
    assert float(edited.layers[1].weight[0, 0]) == -1.0, "wrong value under jit"


def _probe_freeze() -> None:
    kit = get_kit("treeclass")
    layer = kit.frozen_linear(jnp.ones((2, 2)), jnp.zeros(2), jnp.full(2, 3.0), "tanh")
    leaves = jax.tree_util.tree_leaves(layer)
    assert len(leaves) == 2, f"a frozen leaf is still visible ({len(leaves)} leaves, not 2)"
    scale = jax.jit(lambda tree: kit.unfreeze(tree).scale * 1)(layer)
    np.testing.assert_allclose(np.asarray(scale), 3.0)


def _probe_leafwise() -> None:
    kit, _ = _two_layers()
    layers = [kit.linear(jnp.ones(2), jnp.zeros(2))]
    out = kit.leafwise_mlp(layers) * 2 + 1
    assert float(out.layers[0].weight[0]) == 3.0, "wrong value from model * 2 + 1"


def _probe_checkpoint() -> None:
    import os
    import tempfile

    import treeclass as tc

    _, model = _two_layers()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "probe.safetensors")
        tc.save(path, model)
        loaded = tc.load(path, jax.eval_shape(lambda: model))
    assert float(loaded.layers[1].weight[0, 0]) == 1.0, "tc.load gave different numbers"


def _probe_replace() -> None:
    kit, model = _two_layers()
    layer = model.layers[1].replace(weight=jnp.full((2, 2), 5.0))
    assert float(layer.weight[0, 0]) == 5.0, "wrong value after .replace"
    assert type(layer) is type(model.layers[1]), ".replace changed the type"


# feature name -> (what the report calls it, the probe)
FEATURES: dict[str, tuple[str, Callable[[], None]]] = {
    "at_path": ('`.at["layers"][k]["weight"].set`', _probe_at_path),
    "at_type": ('`.at[Linear]["weight"].apply`', _probe_at_type),
    "at_mask": ("`.at[mask].set`", _probe_at_mask),
    "at_mask_jit": ("`.at[mask].set` under `jax.jit`", _probe_at_mask_jit),
    "freeze": ("`tc.freeze`", _probe_freeze),
    "leafwise": ("`leafwise=True` operators", _probe_leafwise),
    "checkpoint": ("`tc.save` / `tc.load`", _probe_checkpoint),
    "replace": ("`.replace(**changes)`", _probe_replace),
}


@functools.cache
def probe(feature: str) -> str | None:
    """`None` when the treeclass feature works, else a one-line reason it does not.

    **Arguments**

    - `feature`: a key of `FEATURES`.

    **Returns**

    `None`, or e.g. ``"`tc.freeze` is not ready (NotImplementedError: ...)"``.

    ```python
    from benchmarks.probes import probe

    reason = probe("at_path")
    assert reason is None or "not ready" in reason
    ```
    """
    label, run = FEATURES[feature]
    try:
        run()
    except Exception as error:  # any failure means "not ready": the suite must go on
        message = str(error).strip().splitlines()[0] if str(error).strip() else ""
        detail = f"{type(error).__name__}: {message}" if message else type(error).__name__
        if len(detail) > 120:
            detail = detail[:117] + "..."
        return f"treeclass {label} is not ready ({detail})"
    return None
