"""Checkpoints: a tree's data as a state dict, or in a safetensors file. No pickle.

The design is in README.md beside this file.
"""

from ._api import LoadReport, from_state_dict, load, save, state_dict

__all__ = ["state_dict", "from_state_dict", "save", "load", "LoadReport"]
