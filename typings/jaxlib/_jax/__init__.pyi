# jaxlib's compiled `_jax` module ships no type stubs, so mypy cannot see the types jax's
# own annotations name from it (`PyTreeDef`, `Device`) and reports every use of them as an
# error ("PyTreeDef? has no attribute ..."). This stub declares them with `Any` members,
# as pyright already treats them; everything else in the module is `Any`. Found through
# `mypy_path` / pyright's `stubPath` (pyproject.toml); delete it once jaxlib ships stubs.
from typing import Any

from . import pytree as pytree

class Device:
    def __getattr__(self, name: str) -> Any: ...

def __getattr__(name: str) -> Any: ...
