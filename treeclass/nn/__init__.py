"""`treeclass.nn`: the layers every model needs, as TreeClasses.

This module only re-exports; the design (weight layouts, initialisers, roles, modes) is
README.md beside it, and each layer's docstring is its reference.
"""

from ._attention import MultiHeadAttention, rotary_embedding
from ._base import Layer
from ._blocks import DecoderBlock, EncoderBlock, FeedForward, gelu_exact
from ._conv import Conv
from ._embeddings import ClassToken, PatchEmbed, PositionEmbedding
from ._linear import Embed, Linear, LoRA
from ._modes import Dropout, set_training
from ._normalization import BatchNorm, LayerNorm, RMSNorm
from ._sequential import MLP, Sequential

__all__ = [
    "Layer",
    "Linear",
    "Embed",
    "LayerNorm",
    "RMSNorm",
    "BatchNorm",
    "Conv",
    "Dropout",
    "MultiHeadAttention",
    "rotary_embedding",
    "MLP",
    "FeedForward",
    "gelu_exact",
    "Sequential",
    "LoRA",
    "PatchEmbed",
    "ClassToken",
    "PositionEmbedding",
    "DecoderBlock",
    "EncoderBlock",
    "set_training",
]
