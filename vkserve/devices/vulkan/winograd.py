"""Winograd convolutions F(m x m, 3 x 3) on Vulkan: when they run, and the weights' transform.

A 3x3 stride-1 convolution (one group) computes each m x m output tile from an n x n input
patch (n = m + 2) with n^2 products per channel pair instead of 9 m^2 (Lavin and Gray, "Fast
Algorithms for Convolutional Neural Networks", 2015): the input patches are transformed (B^T d
B, winograd_input.comp), each of the n^2 transformed elements is one GEMM of (output channels x
input channels) by (input channels x tiles) (gemm_coopmat.comp on the tensor cores, gemm.comp
elsewhere: layers.matmul's ``gemm_dispatches``), and the products are transformed back (A^T M
A, with the bias, a folded residual and the activation: winograd_output.comp). The weights'
transform U = G g G^T is made once, at load. Two sizes: F(2, 3) (16 GEMMs, 2.25x fewer
multiply-adds; its transforms are sums and differences) and F(4, 3) (36 GEMMs, 4x fewer; its
coefficients reach 8 in A and 5 in B, so fp16 storage of the transformed values loses more:
the rule takes it only where it was measured faster and `vkserve verify` stayed in its bar).

``VKSERVE_WINOGRAD``: unset or ``auto`` = `winograd_tile`'s measured rule, ``2`` or ``4`` =
every convolution that can, with that tile (for measuring), ``0`` = never.
"""

from __future__ import annotations

import logging
import os

import numpy as np

log = logging.getLogger(__name__)

TILES = (2, 4)  # m: outputs per tile side

#: B^T, G and A^T of F(m, 3), by m
_BT = {2: [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]],
       4: [[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
           [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]]}
_G = {2: [[1, 0, 0], [1 / 2, 1 / 2, 1 / 2], [1 / 2, -1 / 2, 1 / 2], [0, 0, 1]],
      4: [[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
          [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]]}
_AT = {2: [[1, 1, 1, 0], [0, 1, -1, -1]],
       4: [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]]}


def matrices(m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(B^T, G, A^T) of F(m, 3) in float64 (the shaders hold the same B^T and A^T)."""
    return np.array(_BT[m], np.float64), np.array(_G[m], np.float64), np.array(_AT[m], np.float64)


def elements(m: int) -> int:
    """GEMMs of F(m, 3): the transformed tile's (m + 2)^2 elements."""
    return (m + 2) ** 2


def transform_weights(weight: np.ndarray, m: int) -> np.ndarray:
    """(out, in, 3, 3) kernels -> U[element][out][in] (element = n i + j of G g G^T), fp32: the
    A operand of the GEMMs, K (input channels) contiguous."""
    out, cin = weight.shape[:2]
    g = matrices(m)[1]
    u = np.einsum("ik,ockl,jl->ijoc", g, weight.astype(np.float64), g)
    return np.ascontiguousarray(u.reshape(elements(m), out, cin), dtype=np.float32)


def tiles(outh: int, outw: int, m: int) -> tuple[int, int]:
    """(tiles along h, along w): the last tiles overhang an output not a multiple of m."""
    return -(-outh // m), -(-outw // m)


def eligible(kernel: tuple[int, int], stride: tuple[int, int], dilation: tuple[int, int],
             groups: int) -> bool:
    """Whether the shaders can run this convolution: 3x3, stride 1, dilation 1, one group."""
    return kernel == (3, 3) and stride == (1, 1) and dilation == (1, 1) and groups == 1


def _mode() -> str:
    mode = os.environ.get("VKSERVE_WINOGRAD", "auto")
    if mode not in ("auto", "0", "2", "4"):
        log.warning("VKSERVE_WINOGRAD=%r is not auto, 0, 2 or 4: taken as auto", mode)
        return "auto"
    return mode


#: The rule, from every eligible layer of vgg16, resnet18, resnet50, alexnet, yolov4-tiny and
#: squeezenet on an H200 (benchmarks/winograd_layers.py, GPU time per layer; RESULTS.md, issue
#: 17). Against conv_gemm in fp16 (the tensor cores off) F(2, 3) took 0.39-0.92x of its time
#: with 128 or more input channels, 0.65-0.66x with 64 on maps of 112 x 112 and more, but
#: 1.08-1.37x with 64 on 52-56 and 1.1-2.6x with fewer. In fp32 F(4, 3) took 0.47-0.74x on
#: maps of 28 x 28 and more with 128 or more channels (F(2, 3) there 0.57-1.03x) and 0.64-0.88x
#: with 64 on 104 x 104 and more (F(2, 3) 0.83-1.09x), while on smaller maps F(2, 3) was the
#: faster (0.62-0.85x against 0.65-1.04x). Against conv_coopmat (its GEMMs on gemm_coopmat
#: too) F(2, 3) took 0.79-0.88x with 256 or more input channels on maps of 28 x 28 and more
#: (vgg16's conv3_2 to conv4_3), 0.98x with 128 on 56 x 56, and lost everywhere else
#: (1.16-2.4x): its GEMMs are short (K = the input channels, N = the tiles) where
#: conv_coopmat's one GEMM has 9x the K, so only large layers repay the transforms there.
#: F(4, 3) runs in fp32 only: in the fp16 storage modes its transformed values lose ~10x the
#: direct kernel's precision (F(2, 3) ~2x; RESULTS.md).
AUTO_MIN_CHANNELS = 128
AUTO_WIDE_MIN_CHANNELS = 64
AUTO_WIDE_MIN_PIXELS = 112 * 112
AUTO_WIDE_MIN_PIXELS_F4 = 100 * 100
AUTO_F4_MIN_PIXELS = 28 * 28
AUTO_COOP_MIN_CHANNELS = 256
AUTO_COOP_MIN_PIXELS = 28 * 28


def winograd_tile(cin: int, pixels: int, coop: bool, fp32: bool) -> int:
    """The tile m of F(m, 3) an eligible convolution of `cin` input channels and an output of
    `pixels` pixels runs with, 0 for none, by ``VKSERVE_WINOGRAD`` (see above); `coop`: the
    device and mode run the cooperative-matrix shaders (conv_coopmat is the kernel to beat);
    `fp32`: the fp32 mode (the transformed values stored in fp32)."""
    mode = _mode()
    if mode != "auto":
        return int(mode)
    if coop:
        return 2 if cin >= AUTO_COOP_MIN_CHANNELS and pixels >= AUTO_COOP_MIN_PIXELS else 0
    if fp32 and pixels >= AUTO_F4_MIN_PIXELS:
        wide = cin >= AUTO_WIDE_MIN_CHANNELS and pixels >= AUTO_WIDE_MIN_PIXELS_F4
        return 4 if cin >= AUTO_MIN_CHANNELS or wide else 0
    wide = cin >= AUTO_WIDE_MIN_CHANNELS and pixels >= AUTO_WIDE_MIN_PIXELS
    return 2 if cin >= AUTO_MIN_CHANNELS or wide else 0
