"""The forms of the shape / resampling layers (Interp, Crop, Softmax, Permute, Padding,
Pooling, Flatten) and of the fused activations, as single-layer cases for the CPU and Vulkan
form tests: (param line with input blob(s) and output ``out``, input shapes).

Each table covers what ncnn defines for the layer with a few well-chosen shapes rather than
a cross product: every rank the layer takes, every mode, the special values (-233, negative
axes and indices, expressions).
"""

from __future__ import annotations

Case = tuple[str, dict[str, tuple[int, ...]]]


def _one(layer: str, params: str, shape: tuple[int, ...]) -> Case:
    return f"{layer} op 1 1 data out {params}".rstrip(), {"data": shape}


def _two(layer: str, params: str, shape: tuple[int, ...], ref: tuple[int, ...]) -> Case:
    return f"{layer} op 2 1 data ref out {params}".rstrip(), {"data": shape, "ref": ref}


INTERP: list[Case] = [
    *(_one("Interp", f"0={t} 1=2.0 2=2.0", (3, 4, 5)) for t in (1, 2, 3)),
    *(_one("Interp", f"0={t} 1=2.5 2=1.7", (3, 5, 7)) for t in (1, 2, 3)),
    *(_one("Interp", f"0={t} 1=0.5 2=0.5", (3, 9, 9)) for t in (1, 2, 3)),
    *(_one("Interp", f"0={t} 3=3 4=11", (3, 8, 5)) for t in (1, 2, 3)),
    *(_one("Interp", f"0={t} 3=7 4=9 6=1", (3, 4, 5)) for t in (2, 3)),
    _one("Interp", "0=3 1=2.0 2=2.0", (2, 2, 3)),  # bicubic narrower than its 4 taps
    *(_two("Interp", f"0={t} 5=1", (3, 4, 5), (2, 7, 9)) for t in (1, 2, 3)),
    _two("Interp", "0=2 5=1 6=1", (3, 4, 5), (2, 11, 13)),
    # size expressions (param 9): (outw, outh), outw alone, from a second input
    *(_one("Interp", f'0={t} 9="*(0w,2),*(0h,2)"', (3, 4, 5)) for t in (1, 2, 3)),
    _one("Interp", '0=2 9="+(0w,3)"', (3, 4, 5)),
    _two("Interp", '0=3 9="1w,*(0h,2)"', (3, 4, 5), (2, 7, 9)),
    # 2-D: resized along w only; 1-D: each element fills an output channel
    *(_one("Interp", f"0={t} 2=2.5", (5, 6)) for t in (1, 2, 3)),
    _one("Interp", "0=2 4=9 6=1", (5, 6)),
    _one("Interp", '0=1 9="+(0w,3)"', (5, 6)),
    _one("Interp", "0=2 1=2.0 2=3.0", (6,)),
    _one("Interp", "0=3 3=2 4=3", (6,)),
]

CROP: list[Case] = [
    # offsets + sizes, every rank (-233 = the rest; offset2 from the far end)
    _one("Crop", "0=1 3=3", (7,)),
    _one("Crop", "0=1 1=1 3=3 4=2", (5, 6)),
    _one("Crop", "0=1 1=1 2=1 3=3 4=2 5=2", (4, 5, 6)),
    _one("Crop", "0=1 1=1 13=1 2=1 3=3 4=2 14=2 5=2", (3, 4, 5, 6)),
    _one("Crop", "0=1 1=2 2=1 3=-233 4=-233 5=-233 6=1 7=1 8=1", (4, 6, 7)),
    # reference blob: its w/h (and c when it has the input's rank)
    _two("Crop", "0=1 1=1", (3, 5, 6), (2, 3)),
    _two("Crop", "0=1 1=1 2=1", (3, 5, 6), (2, 3, 4)),
    _two("Crop", "0=2", (7,), (3,)),
    _two("Crop", "0=1 1=2", (5, 6), (2, 4)),
    _two("Crop", "0=1 1=1 13=1 2=1", (3, 4, 5, 6), (2, 2, 3, 4)),
    # numpy style arrays: negative starts / ends / axes, -233 open ends
    _one("Crop", "-23309=1,2 -23310=1,-233", (7,)),
    _one("Crop", "-23309=2,1,1 -23310=2,-1,4", (5, 6)),
    _one("Crop", "-23309=1,1 -23310=1,-1 -23311=1,0", (4, 5, 6)),
    _one("Crop", "-23309=2,-3,1 -23310=2,-233,-1 -23311=2,-1,1", (3, 4, 5, 6)),
    # numpy style expressions (params 19 / 20 / 21)
    _one("Crop", '19="1" 20="-(0w,1)" 21="0"', (7,)),
    _one("Crop", '19="1,-233" 20="-233,-(0w,1)" 21="0,-1"', (5, 6)),
    _one("Crop", '19="1,0" 20="-(0c,1),-1" 21="0,-1"', (4, 5, 6)),
    _one("Crop", '19="2" 20="//(0d,1)" 21="1"', (3, 4, 5, 6)),
    _two("Crop", '19="0,1" 20="1h,+(1w,1)" 21="1,2"', (3, 5, 6), (3, 4)),
]

SOFTMAX: list[Case] = [
    _one("Softmax", "0=0", (7,)),
    _one("Softmax", "0=-1 1=1", (7,)),
    *(_one("Softmax", f"0={a} 1=1", (5, 6)) for a in (0, 1, -2)),
    *(_one("Softmax", f"0={a} 1=1", (4, 5, 6)) for a in (0, 1, 2, -1)),
    *(_one("Softmax", f"0={a} 1=1", (3, 4, 5, 6)) for a in (0, 1, 2, 3, -3)),
    _one("Softmax", "0=2 1=1", (3, 40, 5)),  # a line longer than 32 (cooperative on Vulkan)
]

PERMUTE: list[Case] = [
    *(_one("Permute", f"0={o}", (5, 6)) for o in range(2)),
    *(_one("Permute", f"0={o}", (4, 5, 6)) for o in range(6)),
    *(_one("Permute", f"0={o}", (2, 3, 4, 5)) for o in range(24)),
]

PADDING: list[Case] = [
    *(_one("Padding", f"2=1 3=2 4={t} 5=1.5", (7,)) for t in (0, 1, 2)),
    *(_one("Padding", f"0=1 1=2 2=2 3=1 4={t} 5=-0.5", (5, 6)) for t in (0, 1, 2)),
    *(_one("Padding", f"0=1 1=2 2=1 3=2 4={t} 5=0.5 7=1 8=2", (4, 5, 6)) for t in (0, 1, 2)),
    *(_one("Padding", f"0=2 1=1 2=1 3=1 4={t} 5=2.0 7=2 8=1", (3, 4, 5, 6)) for t in (0, 1, 2)),
    # per-channel pad data (type 0): one value per output channel
    _one("Padding", "0=1 1=1 2=1 3=1 4=0 6=4", (4, 5, 6)),
    _one("Padding", "0=1 1=1 2=1 3=1 4=0 6=6 7=1 8=1", (4, 5, 6)),
    _one("Padding", "0=1 1=0 2=0 3=1 4=0 6=3 7=1 8=1", (3, 4, 5, 6)),
    _one("Padding", "0=1 1=1 2=1 3=1 4=0 5=0.5 6=7", (5, 6)),  # 2-D: the value, not the data
]

POOLING: list[Case] = [
    *(_one("Pooling", f"0={t} 1=3 2=2", (4, 9, 10)) for t in (0, 1)),  # full: ceil
    *(_one("Pooling", f"0=1 1=3 2=2 3=1 6={inc}", (4, 9, 9)) for inc in (0, 1)),
    *(_one("Pooling", f"0={t} 1=3 2=2 3=1 5=1", (4, 9, 10)) for t in (0, 1)),  # valid: floor
    *(_one("Pooling", f"0={t} 1=3 2=2 5={m}", (4, 9, 10)) for t in (0, 1) for m in (2, 3)),
    _one("Pooling", "0=1 1=2 11=3 2=1 12=2 3=1 13=1 14=0 15=1 5=1", (3, 8, 9)),
    *(_one("Pooling", f"0={t} 4=1", (4, 9, 10)) for t in (0, 1)),  # global
    *(_one("Pooling", f"0={t} 7=1 8=3 18=4", (4, 9, 10)) for t in (0, 1)),  # adaptive
    _one("Pooling", "0=1 7=1 8=7 18=5", (4, 9, 10)),
    _one("Pooling", "0=0 7=1 8=-233 18=3", (4, 9, 10)),
    # 2-D and 1-D blobs pool as one channel
    *(_one("Pooling", f"0={t} 1=3 2=2", (9, 10)) for t in (0, 1)),
    _one("Pooling", "0=1 4=1", (9, 10)),
    _one("Pooling", "0=0 7=1 8=3 18=2", (9, 10)),
    _one("Pooling", "0=1 4=1", (11,)),
]

FLATTEN: list[Case] = [_one("Flatten", "", s) for s in ((7,), (5, 6), (4, 5, 6), (2, 3, 4, 5))]

# fused activations 0..6 with their params (10 = activation_params, -23310 as an array)
ACTIVATIONS = ["9=0", "9=1", "9=2 -23310=1,0.1", "9=3 -23310=2,-0.5,0.5", "9=4", "9=5",
               "9=6 -23310=2,0.2,0.5"]


def activation_cases(act: str) -> list[Case]:
    """``act`` fused into every layer type that takes one (Gemm and MatMul have none)."""
    return [
        _one("Convolution", f"0=4 1=3 4=1 5=1 6=108 {act}", (3, 6, 7)),
        _one("ConvolutionDepthWise", f"0=4 1=3 5=1 6=36 7=4 {act}", (4, 6, 7)),
        _one("Deconvolution", f"0=4 1=3 3=2 5=1 6=108 {act}", (3, 4, 5)),
        _one("DeconvolutionDepthWise", f"0=4 1=3 5=1 6=36 7=4 {act}", (4, 4, 5)),
        _one("InnerProduct", f"0=8 1=1 2=96 {act}", (12,)),
        _one("InnerProduct", f"0=8 1=1 2=96 {act}", (3, 12)),
    ]


ACTIVATION_CASES: list[Case] = [c for act in ACTIVATIONS for c in activation_cases(act)]

ALL: dict[str, list[Case]] = {
    "interp": INTERP, "crop": CROP, "softmax": SOFTMAX, "permute": PERMUTE,
    "padding": PADDING, "pooling": POOLING, "flatten": FLATTEN,
    "activation": ACTIVATION_CASES,
}


def case_id(case: Case) -> str:
    line, _ = case
    tok = line.split()
    return f"{tok[0]}:{' '.join(tok[4 + int(tok[2]) + int(tok[3]):])}"
