"""CPU kernels (numpy, fp32 compute over bf16 storage) and the registry type name -> kernel."""

from vkserve.devices.cpu.kernels import conv, detection, elementwise, pooling, shape
from vkserve.devices.cpu.kernels.base import REGISTRY, Kernel, Shape, UnsupportedError

__all__ = ["REGISTRY", "Kernel", "Shape", "UnsupportedError", "conv", "detection", "elementwise", "pooling", "shape"]
