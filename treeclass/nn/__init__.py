"""`treeclass.nn`: the layers every model needs, as TreeClasses.

This module only re-exports; the design (weight layouts, initialisers, roles, modes) is
README.md beside it, and each layer's docstring is its reference.
"""

from ._attention import MultiHeadAttention, rotary_embedding
from ._base import Layer
from ._batch_norm import BatchNorm
from ._blocks import DecoderBlock, EncoderBlock
from ._conv import Conv
from ._dropout import Dropout
from ._embeddings import ClassToken, PatchEmbed, PositionEmbedding
from ._feed_forward import FeedForward, gelu_exact
from ._linear import Embed, Linear
from ._lora import LoRA
from ._modes import set_training
from ._normalization import LayerNorm, RMSNorm
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
