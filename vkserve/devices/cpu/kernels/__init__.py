"""CPU kernels (numpy, fp32 compute over bf16 storage) and the registry type name -> kernel."""

from vkserve.devices.cpu.kernels import (
    activation,
    conv,
    deconv,
    detection,
    elementwise,
    matmul,  # noqa: F401  (registers Gemm, MatMul)
    norm,
    pooling,
    reduction,  # noqa: F401  (registers Reduction, PixelShuffle, Reorg, Tile, GLU)
    shape,
)
from vkserve.devices.cpu.kernels.base import REGISTRY, Kernel

__all__ = ["REGISTRY", "Kernel", "activation", "conv", "deconv", "detection", "elementwise", "norm",
           "pooling", "shape"]
