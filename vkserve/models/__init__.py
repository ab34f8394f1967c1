"""ncnn .param/.bin reading, typed layer params, graph IR, shape inference, weight writer."""

from vkserve.models.errors import ModelFormatError
from vkserve.models.graph import Graph, Layer, load_model

__all__ = ["Graph", "Layer", "ModelFormatError", "load_model"]
