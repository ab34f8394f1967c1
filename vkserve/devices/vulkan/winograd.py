"""Winograd F(2x2, 3x3) convolutions on Vulkan: when they run, and the weights' transform.

A 3x3 stride-1 convolution (one group) computes each 2 x 2 output tile from a 4 x 4 input
patch with 16 products per channel pair instead of 36 (Lavin and Gray, "Fast Algorithms for
Convolutional Neural Networks", 2015): the input patches are transformed (B^T d B,
winograd_input.comp), each of the 16 transformed elements is one GEMM of (output channels x
input channels) by (input channels x tiles) (gemm_coopmat.comp on the tensor cores, gemm.comp
elsewhere: layers.matmul's ``gemm_dispatches``), and the products are transformed back (A^T m
A, with the bias, a folded residual and the activation: winograd_output.comp). The weights'
transform U = G g G^T is made once, at load. F(2x2, 3x3) and not F(4x4, 3x3): its transforms
are sums and differences (0.5 in G only), so in the fp16 storage modes the intermediate
values keep the direct convolution's precision; F(4, 3)'s coefficients (up to 8 in A, 5 in B)
would amplify fp16 rounding.

``VKSERVE_WINOGRAD``: unset or ``auto`` = `winograd_wanted`'s measured rule, ``1`` = every
convolution that can (for measuring), ``0`` = never.
"""

from __future__ import annotations

import logging
import os

import numpy as np

log = logging.getLogger(__name__)

TILE = 2  # outputs per tile side
PATCH = 4  # input patch side, and the transformed tile's
ELEMENTS = PATCH * PATCH  # GEMMs per layer

#: G of F(2, 3): U = G g G^T maps a 3 x 3 kernel to the 4 x 4 transformed one
G = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]], np.float64)


def transform_weights(weight: np.ndarray) -> np.ndarray:
    """(out, in, 3, 3) kernels -> U[element][out][in] (element = 4 i + j of G g G^T), fp32:
    the A operand of the 16 GEMMs, K (input channels) contiguous."""
    out, cin = weight.shape[:2]
    u = np.einsum("ik,ockl,jl->ijoc", G, weight.astype(np.float64), G)
    return np.ascontiguousarray(u.reshape(ELEMENTS, out, cin), dtype=np.float32)


def tiles(outh: int, outw: int) -> tuple[int, int]:
    """(tiles along h, along w): an odd-sized output's last tile overhangs it."""
    return -(-outh // TILE), -(-outw // TILE)


def eligible(kernel: tuple[int, int], stride: tuple[int, int], dilation: tuple[int, int],
             groups: int) -> bool:
    """Whether the shaders can run this convolution: 3x3, stride 1, dilation 1, one group."""
    return kernel == (3, 3) and stride == (1, 1) and dilation == (1, 1) and groups == 1


def _mode() -> str:
    mode = os.environ.get("VKSERVE_WINOGRAD", "auto")
    if mode not in ("auto", "0", "1"):
        log.warning("VKSERVE_WINOGRAD=%r is not auto, 0 or 1: taken as auto", mode)
        return "auto"
    return mode


#: The rule, from every eligible layer of vgg16, resnet18, resnet50, alexnet, yolov4-tiny and
#: squeezenet on an H200 (benchmarks/winograd_layers.py, GPU time per layer; RESULTS.md, issue
#: 17). Against conv_gemm (fp16 without the tensor cores, and fp32) Winograd took 0.39-0.92x of
#: its time with 128 or more input channels (fp32: 0.56-1.03x), 0.65-0.66x with 64 on maps of
#: 112 x 112 and more (fp32: 0.83-0.94x), but 1.08-1.37x with 64 on 52-56 (fp32 1.19-1.39x) and
#: 1.1-2.6x with fewer. Against conv_coopmat (its GEMMs on gemm_coopmat too) it took 0.79-0.88x
#: with 256 or more input channels on maps of 28 x 28 and more (vgg16's conv3_2 to conv4_3),
#: 0.98x with 128 on 56 x 56, and lost everywhere else (1.16-2.4x: 26 x 26 and smaller maps, or
#: fewer channels): its 16 GEMMs are short (K = the input channels, N = the tiles) where
#: conv_coopmat's one GEMM has 9x the K, so only large layers repay the transforms there.
AUTO_MIN_CHANNELS = 128
AUTO_WIDE_MIN_CHANNELS = 64
AUTO_WIDE_MIN_PIXELS = 112 * 112
AUTO_COOP_MIN_CHANNELS = 256
AUTO_COOP_MIN_PIXELS = 28 * 28


def winograd_wanted(cin: int, pixels: int, coop: bool) -> bool:
    """Whether an eligible convolution of `cin` input channels and an output of `pixels`
    pixels runs as Winograd, by ``VKSERVE_WINOGRAD`` (see above); `coop`: the device and mode
    run the cooperative-matrix shaders (conv_coopmat is the kernel to beat)."""
    mode = _mode()
    if mode != "auto":
        return mode == "1"
    if coop:
        return cin >= AUTO_COOP_MIN_CHANNELS and pixels >= AUTO_COOP_MIN_PIXELS
    return cin >= AUTO_MIN_CHANNELS or (cin >= AUTO_WIDE_MIN_CHANNELS and pixels >= AUTO_WIDE_MIN_PIXELS)
