"""Models: the protocol, function models and the built-in providers."""

from . import scripted
from .base import ChunkCallback, FunctionModel, Model

__all__ = ["ChunkCallback", "FunctionModel", "Model", "scripted"]
