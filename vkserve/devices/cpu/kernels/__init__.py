"""CPU kernels (numpy, fp32 compute over bf16 storage) and the registry type name -> kernel."""

from vkserve.devices.cpu.kernels import conv, detection, elementwise, pooling, shape
from vkserve.devices.cpu.kernels.base import REGISTRY, Kernel

__all__ = ["REGISTRY", "Kernel", "conv", "detection", "elementwise", "pooling", "shape"]
