"""`backend_context`: sepes's backend switch, for the one backend treeclass has (JAX)."""

from __future__ import annotations

import contextlib

JAX_ONLY_MSG = (
    "treeclass is JAX-only: its trees are JAX pytrees and it has no {name!r} backend, so "
    "`backend_context` accepts only 'jax' (where it changes nothing). Code written for "
    "sepes's other backends runs here once it uses JAX's pytrees:\n"
    "    before: with sp.backend_context({name!r}): ...\n"
    "    after:  with tc.backend_context('jax'): ...   # or no context at all"
)


def backend_context(backend_name: str) -> contextlib.AbstractContextManager[None]:
    """A context manager for sepes code that picks a tree backend: treeclass trees are
    always JAX pytrees, so `"jax"` is accepted and changes nothing.

    **Arguments**

    - `backend_name`: `"jax"`; any other name raises `ValueError` (treeclass is JAX-only).

    **Returns**

    A context manager that does nothing.

    ```python
    import treeclass as tc

    with tc.backend_context("jax"):
        assert tc.is_tree_equal([1], [1])
    ```
    """
    if backend_name != "jax":
        raise ValueError(JAX_ONLY_MSG.format(name=backend_name))
    return contextlib.nullcontext()
