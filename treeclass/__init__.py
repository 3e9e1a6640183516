"""treeclass: JAX pytrees that are pleasant and fast to define, read, edit and train.

This module only re-exports; the design (modules floor by floor, the invariants, how to
measure a change) is docs/architecture.md.
"""

from . import optim  # optax itself is imported lazily, on first use
from ._at import AtIndexer, at
from ._autoinit import autoinit
from ._backend import backend_context
from ._calls import value_and_tree
from ._checkpoint import LoadReport, from_state_dict, load, save, state_dict
from ._fields import Field, field, fields
from ._frozen import FrozenArrayWarning, freeze, is_frozen, unfreeze
from ._glob import glob
from ._leafwise import bcmap, leafwise
from ._mask import is_masked, is_nondiff, tree_mask, tree_unmask
from ._periodic import Periodic
from ._pprint import (
    tree_diagram,
    tree_graph,
    tree_mermaid,
    tree_repr,
    tree_repr_with_trace,
    tree_str,
    tree_summary,
)
from ._pprint_registry import PrintRule, register_printer
from ._roles import roles
from ._selectors import BaseKey, where
from ._sharding import ShardingRules, init_like, shardings_like
from ._stacked import Stacked, restack, unstack_all
from ._trace import tree_flatten_with_trace, tree_leaves_with_trace, tree_map_with_trace
from ._treeclass import TreeClass
from ._util import Partial, is_tree_equal

__all__ = [
    # classes and fields
    "TreeClass",
    "Field",
    "field",
    "fields",
    "autoinit",
    "leafwise",
    # indexing
    "at",
    "AtIndexer",
    "BaseKey",
    "where",
    "glob",
    # stacked blocks
    "Stacked",
    "Periodic",
    "unstack_all",
    "restack",
    # tree maps
    "bcmap",
    "Partial",
    "is_tree_equal",
    "tree_map_with_trace",
    "tree_leaves_with_trace",
    "tree_flatten_with_trace",
    "value_and_tree",
    # masking
    "freeze",
    "FrozenArrayWarning",
    "unfreeze",
    "is_frozen",
    "is_masked",
    "is_nondiff",
    "tree_mask",
    "tree_unmask",
    # roles
    "roles",
    # printing
    "tree_repr",
    "tree_str",
    "tree_diagram",
    "tree_summary",
    "tree_graph",
    "tree_mermaid",
    "tree_repr_with_trace",
    "register_printer",
    "PrintRule",
    # sharding
    "ShardingRules",
    "init_like",
    "shardings_like",
    # checkpoints
    "state_dict",
    "from_state_dict",
    "save",
    "load",
    "LoadReport",
    # sepes compatibility
    "backend_context",
    # optax integration (a submodule)
    "optim",
    # layers (a submodule, imported on first use)
    "nn",
]


def __getattr__(name: str) -> object:
    # `tc.nn` defines a dozen classes (tens of milliseconds): only for programs using it
    if name == "nn":
        import importlib

        return importlib.import_module(".nn", __name__)
    raise AttributeError(f"module 'treeclass' has no attribute {name!r}")


__version__ = "0.1.0"
