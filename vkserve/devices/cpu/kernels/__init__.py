"""CPU kernels (numpy, fp32 compute over bf16 storage) and the registry type name -> kernel."""

from vkserve.devices.cpu.kernels import (
    activation,
    attention,  # noqa: F401  (registers MultiHeadAttention)
    conv,
    deconv,
    detection,
    elementwise,
    matmul,  # noqa: F401  (registers Gemm, MatMul)
    norm,
    pooling,
    reduction,  # noqa: F401  (registers Reduction, PixelShuffle, Reorg, Tile, GLU)
    shape,
    vector_ops,  # noqa: F401  (registers ArgMax, Cast, Normalize, MVN, Embed)
)
from vkserve.devices.cpu.kernels.base import REGISTRY, Kernel

__all__ = ["REGISTRY", "Kernel", "activation", "conv", "deconv", "detection", "elementwise", "norm",
           "pooling", "shape"]
