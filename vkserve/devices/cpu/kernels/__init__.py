"""CPU kernels (numpy, fp32 compute over bf16 storage) and the registry type name -> kernel."""

from vkserve.devices.cpu.kernels import activation, conv, detection, elementwise, norm, pooling, shape
from vkserve.devices.cpu.kernels.base import REGISTRY, Kernel

__all__ = ["REGISTRY", "Kernel", "activation", "conv", "detection", "elementwise", "norm", "pooling",
           "shape"]
