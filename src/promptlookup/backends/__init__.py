"""Target backends: how the decoding loop reaches the model being accelerated."""

from .base import Target

__all__ = ["Target"]
