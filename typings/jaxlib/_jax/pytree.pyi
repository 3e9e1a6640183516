# See __init__.pyi: a tree definition's methods and attributes, as `Any`.
from typing import Any

class PyTreeDef:
    def __getattr__(self, name: str) -> Any: ...

def __getattr__(name: str) -> Any: ...
