"""Typed parameters, weight layout and shape inference for each supported ncnn layer type.

Every layer type has a frozen dataclass ``<Type>Params`` whose fields carry ncnn's param names,
ids and defaults (docs/developer-guide/operators.md and each layer's ``load_param``), including
ncnn's fallbacks (``kernel_h`` defaults to ``kernel_w``, ``pad_right`` to ``pad_left`` ...: such
fields default to ``None`` and are resolved on construction). Build one with
``from_paramdict(pd, where)``; ``LAYER_TYPES`` maps the type name to the class.

Shapes follow ncnn's Mat with an implicit batch of 1, written as numpy C-order tuples:
``(w,)``, ``(h, w)``, ``(c, h, w)``, ``(c, d, h, w)``.

This is the one home of each layer's meaning: besides output shapes, the per-layer arithmetic
both engines need (padding, pooling windows, crop windows, resize steps, fused-activation
parameters ...) is defined here, as ncnn defines it, and the engines only implement it.

``weight_specs()`` lists the weights in the order ncnn's ``load_model`` reads them; a *flagged*
weight is preceded in the .bin by a 4-byte storage tag (fp32 / fp16 / quantized), an unflagged
one is raw float32.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, NamedTuple, Self

import numpy as np

from vkserve.models.errors import ModelFormatError, Where
from vkserve.models.paramdict import ParamDict, int_bits_to_float
from vkserve.models.shape_expr import ExpressionError, ShapeExpression

Shape = tuple[int, ...]

FLT_MAX = float(np.finfo(np.float32).max)
# ncnn's "not set" marker for several params (Reshape dims, Crop starts/ends, pads, ...).
UNSET = -233
SAME_UPPER = -233
SAME_LOWER = -234


class ShapeError(ValueError):
    """A layer cannot produce outputs for the given input shapes (the graph adds file/line)."""


class Pads(NamedTuple):
    """Rows / columns added around an (h, w) image before a window slides; negative ones crop."""

    top: int
    bottom: int
    left: int
    right: int


class WeightSpec(NamedTuple):
    """One weight as ``load_model`` reads it: name, element count, tagged (flagged) or raw fp32."""

    name: str
    count: int
    flagged: bool


# ---------------------------------------------------------------------------------------------
# field declarations


def _param(kind: str, pid: int, default: Any, fallback: str | None) -> Any:
    meta = {"pid": pid, "kind": kind, "fallback": fallback}
    return dataclasses.field(default=None if fallback else default, metadata=meta)


def p_int(pid: int, default: int = 0, fallback: str | None = None) -> Any:
    return _param("int", pid, default, fallback)


def p_float(pid: int, default: float = 0.0) -> Any:
    return _param("float", pid, default, None)


def p_ints(pid: int) -> Any:
    return _param("ints", pid, (), None)


def p_floats(pid: int) -> Any:
    return _param("floats", pid, (), None)


def p_str(pid: int) -> Any:
    return _param("str", pid, "", None)


def _describe(value: object) -> str:
    if isinstance(value, list):
        return f"array of {len(value)}"
    if isinstance(value, int):
        return f"int '{value}'"
    if isinstance(value, float):
        return f"float '{value:g}'"
    return f"string {value!r}"


def _convert(kind: str, value: object) -> object:
    """Convert a parsed value for a field of ``kind``; None when its type does not fit."""
    if kind == "str":
        return value if isinstance(value, str) else None
    if kind == "int":
        return value if isinstance(value, int) else None
    if kind == "float":
        if isinstance(value, float):
            return value
        # int 0 has the bits of 0.0; any other int would be read by ncnn as a bit pattern
        return 0.0 if value == 0 and isinstance(value, int) else None
    if not isinstance(value, list):
        return None
    if kind == "ints":
        return tuple(value) if all(isinstance(v, int) for v in value) else None
    # float arrays: ncnn reads int elements through the union, i.e. as float32 bit patterns
    return tuple(int_bits_to_float(v) if isinstance(v, int) else v for v in value)


_EXPECTED = {"int": "int", "float": "float", "ints": "int array", "floats": "float array",
             "str": "string"}


# ---------------------------------------------------------------------------------------------
# shape helpers (ncnn Mat w/h/d/c <-> numpy tuples)


def c_div(a: int, b: int) -> int:
    """C integer division (truncates toward zero)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def c_mod(a: int, b: int) -> int:
    """C remainder (sign of the dividend)."""
    return a - b * c_div(a, b)


def mat_whdc(shape: Shape) -> tuple[int, int, int, int]:
    """ncnn's (w, h, d, c) of a numpy-order shape; absent axes are 1."""
    if len(shape) == 4:
        c, d, h, w = shape
        return w, h, d, c
    if len(shape) == 3:
        c, h, w = shape
        return w, h, 1, c
    if len(shape) == 2:
        return shape[1], shape[0], 1, 1
    return shape[0], 1, 1, 1


def volume(shape: Shape) -> int:
    return math.prod(shape)


def positive_axis(axis: int, dims: int) -> int:
    """ncnn's axis number (negative: from the end) as the numpy axis of a ``dims``-D blob."""
    positive = axis + dims if axis < 0 else axis
    if not 0 <= positive < dims:
        raise ShapeError(f"axis {axis} out of range for a {dims}-D input")
    return positive


def _need_dims(layer: str, shape: Shape, allowed: tuple[int, ...]) -> None:
    if len(shape) not in allowed:
        dims = " or ".join(f"{n}-D" for n in allowed)
        raise ShapeError(f"{layer} expects a {dims} input, got shape {shape}")


def _positive(layer: str, shape: Shape) -> Shape:
    if any(n <= 0 for n in shape):
        raise ShapeError(f"{layer} would produce an empty output of shape {shape}")
    return shape


# ---------------------------------------------------------------------------------------------
# base class


@dataclasses.dataclass(frozen=True)
class LayerParams:
    """Base of all ``<Type>Params`` classes."""

    TYPE: ClassVar[str] = ""
    # params whose presence this implementation cannot honour: id -> reason
    UNSUPPORTED: ClassVar[dict[int, str]] = {}
    # allowed input / output counts (inclusive bounds; None = unbounded)
    INPUTS: ClassVar[tuple[int, int | None]] = (1, 1)
    OUTPUTS: ClassVar[tuple[int, int | None]] = (1, 1)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            fallback = f.metadata.get("fallback")
            if fallback and getattr(self, f.name) is None:
                object.__setattr__(self, f.name, getattr(self, fallback))

    @classmethod
    def from_paramdict(cls, pd: ParamDict, where: Where) -> Self:
        """Build from parsed params; type mismatches and unsupported params raise
        ModelFormatError naming ``where`` and the param id. Unknown ids are ignored (as ncnn)."""
        kwargs: dict[str, object] = {}
        for f in dataclasses.fields(cls):
            if not f.metadata or f.metadata["pid"] not in pd:
                continue
            pid, kind = f.metadata["pid"], f.metadata["kind"]
            value = pd[pid]
            converted = _convert(kind, value)
            if converted is None:
                raise ModelFormatError.at(
                    where,
                    f"param {pid} ({f.name}): expected {_EXPECTED[kind]}, got {_describe(value)}",
                )
            kwargs[f.name] = converted
        for pid, reason in cls.UNSUPPORTED.items():
            if pid in pd:
                raise ModelFormatError.at(where, f"param {pid}: {reason} is not supported")
        params = cls(**kwargs)
        problem = params.validate()
        if problem:
            raise ModelFormatError.at(where, problem)
        return params

    def validate(self) -> str | None:
        """A message when the param values are unusable, else None."""
        return None

    def arity(self) -> tuple[tuple[int, int | None], tuple[int, int | None]]:
        """(min, max) input count and (min, max) output count this layer accepts."""
        return self.INPUTS, self.OUTPUTS

    def weight_specs(self) -> list[WeightSpec]:
        return []

    def infer_shapes(self, input_shapes: list[Shape], num_outputs: int = 1) -> list[Shape]:
        """Output shapes for ``input_shapes``; raises ShapeError when they do not fit."""
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class _SameShape(LayerParams):
    """Elementwise layers: one input, output of the same shape."""

    def infer_shapes(self, input_shapes: list[Shape], num_outputs: int = 1) -> list[Shape]:
        return [tuple(input_shapes[0])]


_ACTIVATION_NAMES = {0: "none", 1: "relu", 2: "leakyrelu", 3: "clip", 4: "sigmoid",
                     5: "mish", 6: "hardswish"}
_ACTIVATION_PARAM_COUNT = {2: 1, 3: 2, 6: 2}
_ACTIVATION_DEFAULTS = {3: (-FLT_MAX, FLT_MAX), 6: (0.2, 0.5)}


def activation_values(activation_type: int, activation_params: tuple[float, ...]) -> tuple[float, float]:
    """The two parameters of a fused activation (leaky slope; clip min, max; hardswish alpha,
    beta), ncnn's defaults where absent; 0.0 for a parameter the type does not take."""
    defaults = _ACTIVATION_DEFAULTS.get(activation_type, (0.0, 0.0))
    given = [float(v) for v in activation_params]
    return (given[0] if given else defaults[0], given[1] if len(given) > 1 else defaults[1])


def _check_activation(activation_type: int, activation_params: tuple[float, ...]) -> str | None:
    if activation_type not in _ACTIVATION_NAMES:
        return f"param 9 (activation_type): unknown activation type {activation_type}"
    need = _ACTIVATION_PARAM_COUNT.get(activation_type, 0)
    if len(activation_params) < need:
        return (
            f"param 10 (activation_params): activation {_ACTIVATION_NAMES[activation_type]} "
            f"needs {need} value(s), got {len(activation_params)}"
        )
    return None


def _same_pads(h: int, w: int, ext_h: int, ext_w: int, stride_h: int, stride_w: int,
               lower: bool) -> Pads:
    """ncnn's SAME padding (Convolution and Pooling make_padding): none unless some is needed;
    then hpad / 2 on top and the rest at the bottom (swapped for SAME_LOWER), likewise w."""
    hpad = ext_h + c_div(h - 1, stride_h) * stride_h - h
    wpad = ext_w + c_div(w - 1, stride_w) * stride_w - w
    if hpad <= 0 and wpad <= 0:
        return Pads(0, 0, 0, 0)
    hs, ws = c_div(hpad, 2), c_div(wpad, 2)
    if lower:
        return Pads(hpad - hs, hs, wpad - ws, ws)
    return Pads(hs, hpad - hs, ws, wpad - ws)


# ---------------------------------------------------------------------------------------------
# layers


@dataclasses.dataclass(frozen=True)
class InputParams(LayerParams):
    TYPE: ClassVar[str] = "Input"
    INPUTS: ClassVar[tuple[int, int | None]] = (0, 0)
    OUTPUTS: ClassVar[tuple[int, int | None]] = (1, None)
    w: int = p_int(0)
    h: int = p_int(1)
    d: int = p_int(11)
    c: int = p_int(2)

    def declared_shape(self) -> Shape | None:
        """The shape the params declare, or None when some dimension is 0 / unspecified."""
        if self.c > 0:
            shape: Shape = (self.c, self.d, self.h, self.w) if self.d > 0 else (self.c, self.h, self.w)
        elif self.h > 0:
            shape = (self.h, self.w)
        else:
            shape = (self.w,)
        return shape if all(n > 0 for n in shape) else None

    def infer_shapes(self, input_shapes: list[Shape], num_outputs: int = 1) -> list[Shape]:
        shape = self.declared_shape()
        if shape is None:
            raise ShapeError(
                f"Input declares no complete shape (w={self.w} h={self.h} d={self.d} c={self.c}); "
                "give it in input_shapes"
            )
        return [shape] * num_outputs


@dataclasses.dataclass(frozen=True)
class _ConvolutionBase(LayerParams):
    UNSUPPORTED: ClassVar[dict[int, str]] = {19: "dynamic_weight"}
    num_output: int = p_int(0)
    kernel_w: int = p_int(1)
    kernel_h: int = p_int(11, fallback="kernel_w")
    dilation_w: int = p_int(2, 1)
    dilation_h: int = p_int(12, fallback="dilation_w")
    stride_w: int = p_int(3, 1)
    stride_h: int = p_int(13, fallback="stride_w")
    pad_left: int = p_int(4)
    pad_right: int = p_int(15, fallback="pad_left")
    pad_top: int = p_int(14, fallback="pad_left")
    pad_bottom: int = p_int(16, fallback="pad_top")
    pad_value: float = p_float(18)
    bias_term: int = p_int(5)
    weight_data_size: int = p_int(6)
    int8_scale_term: int = p_int(8)
    activation_type: int = p_int(9)
    activation_params: tuple[float, ...] = p_floats(10)

    def group_count(self) -> int:
        return 1

    def validate(self) -> str | None:
        if self.num_output <= 0:
            return f"param 0 (num_output): must be positive, got {self.num_output}"
        for name in ("kernel_w", "kernel_h", "dilation_w", "dilation_h", "stride_w", "stride_h"):
            if getattr(self, name) <= 0:
                return f"{name} must be positive, got {getattr(self, name)}"
        if self.weight_data_size <= 0:
            return f"param 6 (weight_data_size): must be positive, got {self.weight_data_size}"
        if self.int8_scale_term:
            return "param 8 (int8_scale_term): int8 quantized layers are not supported"
        return _check_activation(self.activation_type, self.activation_params)

    def weight_specs(self) -> list[WeightSpec]:
        specs = [WeightSpec("weight_data", self.weight_data_size, True)]
        if self.bias_term:
            specs.append(WeightSpec("bias_data", self.num_output, False))
        return specs

    def kernel_extent(self) -> tuple[int, int]:
        """(h, w) of the input window one output reads (the dilated kernel)."""
        return (self.dilation_h * (self.kernel_h - 1) + 1,
                self.dilation_w * (self.kernel_w - 1) + 1)

    def pads(self, h: int, w: int) -> Pads:
        """ncnn's Convolution::make_padding for an (h, w) input: the declared pads when any is
        positive (a negative one then crops); all four -233 (SAME_UPPER) or -234 (SAME_LOWER):
        what keeps ceil(size / stride) outputs, the odd pixel bottom/right resp. top/left;
        otherwise none."""
        declared = Pads(self.pad_top, self.pad_bottom, self.pad_left, self.pad_right)
        if any(p > 0 for p in declared):
            return declared
        for code in (SAME_UPPER, SAME_LOWER):
            if all(p == code for p in declared):
                ext_h, ext_w = self.kernel_extent()
                return _same_pads(h, w, ext_h, ext_w, self.stride_h, self.stride_w,
                                  code == SAME_LOWER)
        return Pads(0, 0, 0, 0)

    def padded_size(self, w: int, h: int) -> tuple[int, int]:
        """Input (w, h) after ``pads``."""
        t, b, l, r = self.pads(h, w)
        return w + l + r, h + t + b

    def check_weights(self, c: int) -> None:
        """ShapeError unless ``c`` input channels split into the groups and weight_data_size is
        num_output / group x c / group x kernel x group (Convolution's and Deconvolution's)."""
        group = self.group_count()
        if c % group:
            raise ShapeError(f"input channels {c} not divisible by group {group}")
        maxk = self.kernel_w * self.kernel_h
        expected = (self.num_output // group) * (c // group) * maxk * group
        if expected != self.weight_data_size:
            raise ShapeError(
                f"weight_data_size {self.weight_data_size} does not match {self.num_output} "
                f"outputs x {c} input channels / group {group} x {self.kernel_h}x{self.kernel_w} "
                f"kernel = {expected}"
            )

    def infer_shapes(self, input_shapes: list[Shape], num_outputs: int = 1) -> list[Shape]:
        shape = input_shapes[0]
        _need_dims(self.TYPE, shape, (3,))
        c, h, w = shape
        self.check_weights(c)
        pw, ph = self.padded_size(w, h)
        ext_h, ext_w = self.kernel_extent()
        if pw < ext_w or ph < ext_h:
            raise ShapeError(f"padded input {ph}x{pw} smaller than kernel extent {ext_h}x{ext_w}")
        out = (self.num_output, (ph - ext_h) // self.stride_h + 1, (pw - ext_w) // self.stride_w + 1)
        return [_positive(self.TYPE, out)]


@dataclasses.dataclass(frozen=True)
class ConvolutionParams(_ConvolutionBase):
    TYPE: ClassVar[str] = "Convolution"


@dataclasses.dataclass(frozen=True)
class ConvolutionDepthWiseParams(_ConvolutionBase):
    TYPE: ClassVar[str] = "ConvolutionDepthWise"
    group: int = p_int(7, 1)

    def group_count(self) -> int:
        return self.group

    def validate(self) -> str | None:
        if self.group <= 0 or self.num_output % self.group:
            return f"param 7 (group): {self.group} does not divide num_output {self.num_output}"
        return super().validate()


@dataclasses.dataclass(frozen=True)
class _DeconvolutionBase(_ConvolutionBase):
    """ncnn's Deconvolution: Convolution's kernel / dilation / stride / pad / bias / weight ids
    (and its ``kernel_extent`` and weight check); ids 18 / 19 are output_pad here (no pad_value,
    no int8). Weights are [num_output][channels / group][kernel_h][kernel_w], not flipped: input
    (y, x) adds x * weight[ky][kx] to the full output at (y * stride + ky * dilation,
    x * stride + kx * dilation); the full output, ``full_size``, is then cut by ``pads``."""

    UNSUPPORTED: ClassVar[dict[int, str]] = {28: "dynamic_weight"}
    pad_value: float = 0.0  # not a Deconvolution param
    int8_scale_term: int = 0  # not a Deconvolution param
    output_pad_right: int = p_int(18)
    output_pad_bottom: int = p_int(19, fallback="output_pad_right")
    output_w: int = p_int(20)
    output_h: int = p_int(21, fallback="output_w")

    def validate(self) -> str | None:
        if self.output_pad_right < 0 or self.output_pad_bottom < 0:
            return "params 18 / 19 (output_pad_right / output_pad_bottom): must not be negative"
        declared = (self.pad_left, self.pad_right, self.pad_top, self.pad_bottom)
        if any(p > 0 for p in declared) and any(p < 0 for p in declared):
            return f"pads {declared}: positive and negative pads together are not supported"
        return super().validate()

    def full_size(self, h: int, w: int) -> tuple[int, int]:
        """(h, w) of the uncut output: (size - 1) * stride + kernel extent + output_pad."""
        ext_h, ext_w = self.kernel_extent()
        return ((h - 1) * self.stride_h + ext_h + self.output_pad_bottom,
                (w - 1) * self.stride_w + ext_w + self.output_pad_right)

    def pads(self, h: int, w: int) -> Pads:
        """What ncnn's Deconvolution::cut_padding cuts off the full output of an (h, w) input:
        the declared pads when any is positive; else, with output_w and output_h both
        positive and some pad -233 (SAME_UPPER) / -234 (SAME_LOWER), the excess over
        output_w / output_h, the odd pixel bottom/right resp. top/left; else nothing (ncnn
        gives no output for output_w / output_h without a SAME pad: a ShapeError)."""
        declared = Pads(self.pad_top, self.pad_bottom, self.pad_left, self.pad_right)
        if any(p > 0 for p in declared):
            return declared
        if self.output_w > 0 and self.output_h > 0:
            fh, fw = self.full_size(h, w)
            hcut, wcut = fh - self.output_h, fw - self.output_w
            if SAME_UPPER in declared:
                return Pads(c_div(hcut, 2), hcut - c_div(hcut, 2), c_div(wcut, 2), wcut - c_div(wcut, 2))
            if SAME_LOWER in declared:
                return Pads(hcut - c_div(hcut, 2), c_div(hcut, 2), wcut - c_div(wcut, 2), c_div(wcut, 2))
            raise ShapeError("output_w / output_h (params 20 / 21) need pads -233 or -234")
        return Pads(0, 0, 0, 0)

    def infer_shapes(self, input_shapes: list[Shape], num_outputs: int = 1) -> list[Shape]:
        shape = input_shapes[0]
        _need_dims(self.TYPE, shape, (3,))
        c, h, w = shape
        self.check_weights(c)
        fh, fw = self.full_size(h, w)
        t, b, l, r = self.pads(h, w)
        if min(t, b, l, r) < 0 or t + b >= fh or l + r >= fw:
            raise ShapeError(f"cannot cut pads {(t, b, l, r)} off the full {fh}x{fw} output")
        return [_positive(self.TYPE, (self.num_output, fh - t - b, fw - l - r))]


@dataclasses.dataclass(frozen=True)
class DeconvolutionParams(_DeconvolutionBase):
    TYPE: ClassVar[str] = "Deconvolution"


@dataclasses.dataclass(frozen=True)
class DeconvolutionDepthWiseParams(_DeconvolutionBase):
    TYPE: ClassVar[str] = "DeconvolutionDepthWise"
    group: int = p_int(7, 1)

    def group_count(self) -> int:
        return self.group

    def validate(self) -> str | None:
        if self.group <= 0 or self.num_output % self.group:
            return f"param 7 (group): {self.group} does not divide num_output {self.num_output}"
        return super().validate()


@dataclasses.dataclass(frozen=True)
class PoolingParams(LayerParams):
    TYPE: ClassVar[str] = "Pooling"
    pooling_type: int = p_int(0)
    kernel_w: int = p_int(1)
    kernel_h: int = p_int(11, fallback="kernel_w")
    stride_w: int = p_int(2, 1)
    stride_h: int = p_int(12, fallback="stride_w")
    pad_left: int = p_int(3)
    pad_right: int = p_int(14, fallback="pad_left")
    pad_top: int = p_int(13, fallback="pad_left")
    pad_bottom: int = p_int(15, fallback="pad_top")
    global_pooling: int = p_int(4)
    pad_mode: int = p_int(5)
    avgpool_count_include_pad: int = p_int(6)
    adaptive_pooling: int = p_int(7)
    out_w: int = p_int(8)
    out_h: int = p_int(18, fallback="out_w")

    def validate(self) -> str | None:
        if self.pooling_type not in (0, 1):
            return f"param 0 (pooling_type): expected 0 (max) or 1 (avg), got {self.pooling_type}"
        if self.pad_mode not in (0, 1, 2, 3):
            return f"param 5 (pad_mode): expected 0..3, got {self.pad_mode}"
        if not self.global_pooling and not self.adaptive_pooling:
            for name in ("kernel_w", "kernel_h", "stride_w", "stride_h"):
                if getattr(self, name) <= 0:
                    return f"{name} must be positive, got {getattr(self, name)}"
        return None

    def _tail(self, h: int, w: int) -> tuple[int, int]:
        """pad_mode 0's extra bottom rows / right columns that keep the last partial window."""
        if self.pad_mode != 0:
            return 0, 0
        htail = c_mod(h + self.pad_top + self.pad_bottom - self.kernel_h, self.stride_h)
        wtail = c_mod(w + self.pad_left + self.pad_right - self.kernel_w, self.stride_w)
        return (self.stride_h - htail if htail else 0), (self.stride_w - wtail if wtail else 0)

    def pads(self, h: int, w: int) -> Pads:
        """ncnn's Pooling::make_padding for an (h, w) input: pad_mode 0 (full) the declared pads
        plus a bottom/right tail that keeps the last partial window (ceil mode), 1 (valid) the
        declared pads, 2 / 3 SAME_UPPER / SAME_LOWER. Max pools pad with -FLT_MAX, average
        pools with 0."""
        if self.pad_mode in (2, 3):
            return _same_pads(h, w, self.kernel_h, self.kernel_w, self.stride_h, self.stride_w,
                              self.pad_mode == 3)
        tail_h, tail_w = self._tail(h, w)
        return Pads(self.pad_top, self.pad_bottom + tail_h, self.pad_left, self.pad_right + tail_w)

    def count_region(self, h: int, w: int) -> tuple[int, int, int, int]:
        """(y0, y1, x0, x1): the cells of the padded input an average without
        avgpool_count_include_pad divides by (those of its window inside): ncnn's bounds, the
        padded input less the declared pads and the full-mode tail."""
        t, b, l, r = self.pads(h, w)
        hp, wp = h + t + b, w + l + r
        tail_h, tail_w = self._tail(h, w)
        return (max(0, self.pad_top), min(hp, hp - self.pad_bottom - tail_h),
                max(0, self.pad_left), min(wp, wp - self.pad_right - tail_w))

    def padded_size(self, w: int, h: int) -> tuple[int, int]:
        """Input (w, h) after ``pads``."""
        t, b, l, r = self.pads(h, w)
        return w + l + r, h + t + b

    @staticmethod
    def image_view(shape: Shape) -> tuple[int, int, int]:
        """(c, h, w) that ncnn pools: a 2-D blob is one channel, a 1-D blob one row."""
        w, h, _, c = mat_whdc(shape)
        return c, h, w

    def adaptive_size(self, h: int, w: int) -> tuple[int, int]:
        """(out_h, out_w) of adaptive pooling: out_h / out_w, -233 keeping the input's."""
        return (h if self.out_h == UNSET else self.out_h), (w if self.out_w == UNSET else self.out_w)

    @staticmethod
    def adaptive_windows(size: int, out: int) -> list[tuple[int, int]]:
        """[start, end) of each of ``out`` adaptive windows over ``size`` cells (ncnn's:
        floor(size * i / out) to ceil(size * (i + 1) / out))."""
        return [(size * i // out, -(-size * (i + 1) // out)) for i in range(out)]

    def infer_shapes(self, input_shapes: list[Shape], num_outputs: int = 1) -> list[Shape]:
        """A 3-D blob pools to (c, outh, outw), as does a 2-D or 1-D one (of one channel);
        global pooling gives (c,). ncnn reads a 4-D blob's first depth slice only: refused."""
        shape = input_shapes[0]
        _need_dims(self.TYPE, shape, (1, 2, 3))
        c, h, w = self.image_view(shape)
        if self.global_pooling:
            return [(c,)]
        if self.adaptive_pooling:
            out_h, out_w = self.adaptive_size(h, w)
            if (out_h, out_w) == (h, w):
                return [tuple(shape)]  # ncnn passes the blob through
            return [_positive(self.TYPE, (c, out_h, out_w))]
        pw, ph = self.padded_size(w, h)
        if pw < self.kernel_w or ph < self.kernel_h:
            raise ShapeError(
                f"padded input {ph}x{pw} smaller than kernel {self.kernel_h}x{self.kernel_w}"
            )
        out = (c, (ph - self.kernel_h) // self.stride_h + 1, (pw - self.kernel_w) // self.stride_w + 1)
        return [_positive(self.TYPE, out)]


@dataclasses.dataclass(frozen=True)
class InnerProductParams(LayerParams):
    TYPE: ClassVar[str] = "InnerProduct"
    num_output: int = p_int(0)
    bias_term: int = p_int(1)
    weight_data_size: int = p_int(2)
    int8_scale_term: int = p_int(8)
    activation_type: int = p_int(9)
    activation_params: tuple[float, ...] = p_floats(10)

    def validate(self) -> str | None:
        if self.num_output <= 0:
            return f"param 0 (num_output): must be positive, got {self.num_output}"
        if self.weight_data_size <= 0 or self.weight_data_size % self.num_output:
            return (
                f"param 2 (weight_data_size): {self.weight_data_size} is not a positive "
                f"multiple of num_output {self.num_output}"
            )
        if self.int8_scale_term:
            return "param 8 (int8_scale_term): int8 quantized layers are not supported"
        return _check_activation(self.activation_type, self.activation_params)

    def weight_specs(self) -> list[WeightSpec]:
        specs = [WeightSpec("weight_data", self.weight_data_size, True)]
        if self.bias_term:
            specs.append(WeightSpec("bias_data", self.num_output, False))
        return specs

    def num_input(self) -> int:
        return self.weight_data_size // self.num_output

    def batch_rows(self, shape: Shape) -> int | None:
        """Rows of ncnn's gemm form (a 2-D input whose rows are num_input wide: one output row
        each, even for a single row), or None when the input is read flat."""
        return shape[0] if len(shape) == 2 and shape[1] == self.num_input() else None

    def infer_shapes(self, input_shapes: list[Shape], num_outputs: int = 1) -> list[Shape]:
        shape = input_shapes[0]
        num_input = self.num_input()
        rows = self.batch_rows(shape)
        if rows is not None:
            return [(rows, self.num_output)]
        if volume(shape) != num_input:
            raise ShapeError(
                f"input {shape} has {volume(shape)} elements, weights expect {num_input} inputs"
            )
        return [(self.num_output,)]


@dataclasses.dataclass(frozen=True)
class SoftmaxParams(_SameShape):
    TYPE: ClassVar[str] = "Softmax"
    axis: int = p_int(0)
    fixbug0: int = p_int(1)

    def validate(self) -> str | None:
        if self.fixbug0 == 0 and self.axis != 0:
            return "Softmax with axis != 0 needs 1=1 (param too old, regenerate it)"
        return None

    def infer_shapes(self, input_shapes: list[Shape], num_outputs: int = 1) -> list[Shape]:
        shape = input_shapes[0]
        positive_axis(self.axis, len(shape))
        return [tuple(shape)]


@dataclasses.dataclass(frozen=True)
class SplitParams(LayerParams):
    TYPE: ClassVar[str] = "Split"
    OUTPUTS: ClassVar[tuple[int, int | None]] = (1, None)

    def infer_shapes(self, input_shapes: list[Shape], num_outputs: int = 1) -> list[Shape]:
        return [tuple(input_shapes[0])] * num_outputs


@dataclasses.dataclass(frozen=True)
class ConcatParams(LayerParams):
    TYPE: ClassVar[str] = "Concat"
    INPUTS: ClassVar[tuple[int, int | None]] = (1, None)
    axis: int = p_int(0)

    def infer_shapes(self, input_shapes: list[Shape], num_outputs: int = 1) -> list[Shape]:
        first = input_shapes[0]
        axis = positive_axis(self.axis, len(first))
        total = 0
        for shape in input_shapes:
            rest = tuple(n for i, n in enumerate(shape) if i != axis)
            if len(shape) != len(first) or rest != tuple(
                n for i, n in enumerate(first) if i != axis
            ):
                raise ShapeError(f"cannot concat {shape} with {first} along axis {self.axis}")
            total += shape[axis]
        out = list(first)
        out[axis] = total
        return [tuple(out)]


@dataclasses.dataclass(frozen=True)
class SliceParams(LayerParams):
    TYPE: ClassVar[str] = "Slice"
    OUTPUTS: ClassVar[tuple[int, int | None]] = (1, None)
    slices: tuple[int, ...] = p_ints(0)
    axis: int = p_int(1)
    indices: tuple[int, ...] = p_ints(2)

    def validate(self) -> str | None:
        if not self.slices and not self.indices:
            return "Slice needs param 0 (slices) or param 2 (indices)"
        return None

    def slice_sizes(self, size: int, num_outputs: int) -> list[int]:
        """Size of each output along the axis (ncnn: -233 shares the rest evenly)."""
        sizes: list[int] = []
        q = 0
        for i in range(num_outputs):
            if self.indices:
                if i == num_outputs - 1:
                    n = size - q
                else:
                    if i >= len(self.indices):
                        raise ShapeError(f"{num_outputs} outputs but {len(self.indices)} indices")
                    index = self.indices[i]
                    n = (size + index if index < 0 else index) - q
            else:
                if i >= len(self.slices):
                    raise ShapeError(f"{num_outputs} outputs but {len(self.slices)} slices")
                n = self.slices[i]
                if n == UNSET:
                    n = (size - q) // (num_outputs - i)
            if n <= 0 or q + n > size:
                raise ShapeError(f"slice {i} of size {n} at offset {q} does not fit axis size {size}")
            sizes.append(n)
            q += n
        return sizes

    def infer_shapes(self, input_shapes: list[Shape], num_outputs: int = 1) -> list[Shape]:
        shape = input_shapes[0]
        axis = positive_axis(self.axis, len(shape))
        outs = []
        for n in self.slice_sizes(shape[axis], num_outputs):
            out = list(shape)
            out[axis] = n
            outs.append(tuple(out))
        return outs


@dataclasses.dataclass(frozen=True)
class EltwiseParams(LayerParams):
    TYPE: ClassVar[str] = "Eltwise"
    INPUTS: ClassVar[tuple[int, int | None]] = (1, None)
    op_type: int = p_int(0)
    coeffs: tuple[float, ...] = p_floats(1)

    def validate(self) -> str | None:
        if self.op_type not in (0, 1, 2):
            return f"param 0 (op_type): expected 0 (prod), 1 (sum) or 2 (max), got {self.op_type}"
        return None

    def infer_shapes(self, input_shapes: list[Shape], num_outputs: int = 1) -> list[Shape]:
        first = tuple(input_shapes[0])
        for shape in input_shapes[1:]:
            if tuple(shape) != first:
                raise ShapeError(f"Eltwise inputs differ in shape: {first} vs {tuple(shape)}")
        if self.coeffs and len(self.coeffs) < len(input_shapes):
            raise ShapeError(f"{len(self.coeffs)} coeffs for {len(input_shapes)} inputs")
        return [first]


BINARY_OPS = {0: "add", 1: "sub", 2: "mul", 3: "div", 4: "max", 5: "min", 6: "pow",
              7: "rsub", 8: "rdiv", 9: "rpow", 10: "atan2", 11: "ratan2", 12: "fmod",
              13: "rfmod", 14: "logaddexp", 15: "floor_divide", 16: "rfloor_divide",
              17: "remainder", 18: "rremainder"}


def binary_broadcast_shape(a: Shape, b: Shape) -> tuple[Shape, Shape, Shape]:
    """ncnn's BinaryOp broadcast: the lower-rank operand is reshaped (1-D matching the other's
    channels -> per-channel, otherwise along w; 2-D/3-D gain trailing unit axes), then numpy-style
    broadcasting. Returns (a reshaped, b reshaped, output shape)."""

    def expand(x: Shape, other: Shape) -> Shape:
        outdims = len(other)
        if len(x) >= outdims:
            return tuple(x)
        if len(x) == 1:
            # matches the other's outermost axis (h for 2-D, c for 3-D/4-D)?
            if x[0] == other[0]:
                return (x[0],) + (1,) * (outdims - 1)
            return (1,) * (outdims - 1) + (x[0],)
        return tuple(x) + (1,) * (outdims - len(x))

    a2, b2 = expand(a, b), expand(b, a)
    out = []
    for axis, (m, n) in enumerate(zip(a2, b2)):
        if m != n and m != 1 and n != 1:
            # ncnn would read past the smaller operand (garbage), so this is refused
            raise ShapeError(f"BinaryOp cannot broadcast {a} with {b}: lined up as ncnn does, "
                             f"{a2} and {b2} differ at axis {axis} ({m} vs {n}) and neither is 1")
        out.append(max(m, n))
    return a2, b2, tuple(out)


@dataclasses.dataclass(frozen=True)
class BinaryOpParams(LayerParams):
    """out = op(a, b) (``BINARY_OPS``; the r* ops swap the operands), b the second input
    broadcast as ``binary_broadcast_shape`` or, with with_scalar, the float param 2. As ncnn's
    x86 kernels: fmod x - trunc(x / y) * y, floor_divide floor(x / y), remainder
    x - round_half_even(x / y) * y (the quotient rounded to float first), logaddexp
    max + log1p(exp(min - max)). pow of a negative base is undefined (ncnn's x86 pow gives
    garbage there)."""

    TYPE: ClassVar[str] = "BinaryOp"
    op_type: int = p_int(0)
    with_scalar: int = p_int(1)
    b: float = p_float(2)

    def validate(self) -> str | None:
        if self.op_type not in BINARY_OPS:
            return f"param 0 (op_type): unknown binary op {self.op_type}"
        return None

    def arity(self) -> tuple[tuple[int, int | None], tuple[int, int | None]]:
        return ((1, 1) if self.with_scalar else (2, 2)), (1, 1)

    def infer_shapes(self, input_shapes: list[Shape], num_outputs: int = 1) -> list[Shape]:
        if self.with_scalar:
            return [tuple(input_shapes[0])]
        return [binary_broadcast_shape(input_shapes[0], input_shapes[1])[2]]


@dataclasses.dataclass(frozen=True)
class ReLUParams(_SameShape):
    TYPE: ClassVar[str] = "ReLU"
    slope: float = p_float(0)


@dataclasses.dataclass(frozen=True)
class ClipParams(_SameShape):
    TYPE: ClassVar[str] = "Clip"
    min: float = p_float(0, -FLT_MAX)
    max: float = p_float(1, FLT_MAX)


@dataclasses.dataclass(frozen=True)
class SigmoidParams(_SameShape):
    TYPE: ClassVar[str] = "Sigmoid"


@dataclasses.dataclass(frozen=True)
class SwishParams(_SameShape):
    TYPE: ClassVar[str] = "Swish"


@dataclasses.dataclass(frozen=True)
class _HardBase(_SameShape):
    alpha: float = p_float(0, 0.2)
    beta: float = p_float(1, 0.5)

    def validate(self) -> str | None:
        return "param 0 (alpha): must be non-zero" if self.alpha == 0 else None


@dataclasses.dataclass(frozen=True)
class HardSigmoidParams(_HardBase):
    """y = clamp(alpha * x + beta, 0, 1); ncnn defaults 0.2 / 0.5 (PyTorch uses 1/6, 0.5)."""

    TYPE: ClassVar[str] = "HardSigmoid"


@dataclasses.dataclass(frozen=True)
class HardSwishParams(_HardBase):
    """y = x * clamp(alpha * x + beta, 0, 1); ncnn defaults 0.2 / 0.5."""

    TYPE: ClassVar[str] = "HardSwish"


@dataclasses.dataclass(frozen=True)
class DropoutParams(_SameShape):
    TYPE: ClassVar[str] = "Dropout"
    scale: float = p_float(0, 1.0)


@dataclasses.dataclass(frozen=True)
class TanHParams(_SameShape):
    TYPE: ClassVar[str] = "TanH"


@dataclasses.dataclass(frozen=True)
class AbsValParams(_SameShape):
    TYPE: ClassVar[str] = "AbsVal"


@dataclasses.dataclass(frozen=True)
class ELUParams(_SameShape):
    """y = x < 0 ? alpha * (exp(x) - 1) : x."""

    TYPE: ClassVar[str] = "ELU"
    alpha: float = p_float(0, 0.1)


@dataclasses.dataclass(frozen=True)
class SELUParams(_SameShape):
    """y = x < 0 ? (exp(x) - 1) * alpha * lambda : x * lambda."""

    TYPE: ClassVar[str] = "SELU"
    alpha: float = p_float(0, 1.67326324)
    lambda_: float = p_float(1, 1.050700987)


@dataclasses.dataclass(frozen=True)
class MishParams(_SameShape):
    """y = x * tanh(log(exp(x) + 1))."""

    TYPE: ClassVar[str] = "Mish"


@dataclasses.dataclass(frozen=True)
class SoftplusParams(_SameShape):
    """y = log(exp(x) + 1)."""

    TYPE: ClassVar[str] = "Softplus"


@dataclasses.dataclass(frozen=True)
class GELUParams(_SameShape):
    """fast_gelu 0: y = 0.5 * x * erfc(-x / sqrt(2)); otherwise the tanh approximation
    y = 0.5 * x * (1 + tanh(0.79788452 * (x + 0.044715 * x^3)))."""

    TYPE: ClassVar[str] = "GELU"
    fast_gelu: int = p_int(0)


@dataclasses.dataclass(frozen=True)
class _ExpLogBase(_SameShape):
    """base -1 means e; the argument is shift + x * scale."""

    base: float = p_float(0, -1.0)
    scale: float = p_float(1, 1.0)
    shift: float = p_float(2, 0.0)


@dataclasses.dataclass(frozen=True)
class ExpParams(_ExpLogBase):
    """y = base ^ (shift + x * scale) (exp when base is -1)."""

    TYPE: ClassVar[str] = "Exp"


@dataclasses.dataclass(frozen=True)
class LogParams(_ExpLogBase):
    """y = log(shift + x * scale) / log(base) (natural log when base is -1)."""

    TYPE: ClassVar[str] = "Log"


@dataclasses.dataclass(frozen=True)
class PowerParams(_SameShape):
    """y = (shift + x * scale) ^ power."""

    TYPE: ClassVar[str] = "Power"
    power: float = p_float(0, 1.0)
    scale: float = p_float(1, 1.0)
    shift: float = p_float(2, 0.0)


@dataclasses.dataclass(frozen=True)
class ErfParams(_SameShape):
    TYPE: ClassVar[str] = "Erf"


@dataclasses.dataclass(frozen=True)
class ThresholdParams(_SameShape):
    """y = x > threshold ? 1 : 0."""

    TYPE: ClassVar[str] = "Threshold"
    threshold: float = p_float(0, 0.0)


@dataclasses.dataclass(frozen=True)
class PReLUParams(_SameShape):
    """y = x < 0 ? x * slope : x; one slope, or one per channel (axis 0: w of a 1-D blob, h
    of a 2-D one, c of a 3-D / 4-D one)."""

    TYPE: ClassVar[str] = "PReLU"
    num_slope: int = p_int(0)

    def validate(self) -> str | None:
        return "param 0 (num_slope): must be at least 1" if self.num_slope < 1 else None

    def weight_specs(self) -> list[WeightSpec]:
        return [WeightSpec("slope_data", self.num_slope, False)]

    def infer_shapes(self, input_shapes: list[Shape], num_outputs: int = 1) -> list[Shape]:
        shape = tuple(input_shapes[0])
        if self.num_slope > 1 and shape[0] != self.num_slope:
            raise ShapeError(f"PReLU has {self.num_slope} slopes but the input {shape} has "
                             f"{shape[0]} channels")
        return [shape]


@dataclasses.dataclass(frozen=True)
class NoopParams(LayerParams):
    """Passes its inputs through: output i is input i."""

    TYPE: ClassVar[str] = "Noop"
    INPUTS: ClassVar[tuple[int, int | None]] = (1, None)
    OUTPUTS: ClassVar[tuple[int, int | None]] = (0, None)

    def infer_shapes(self, input_shapes: list[Shape], num_outputs: int = 1) -> list[Shape]:
        if num_outputs > len(input_shapes):
            raise ShapeError(f"Noop has {num_outputs} outputs but only {len(input_shapes)} inputs")
        return [tuple(s) for s in input_shapes[:num_outputs]]


@dataclasses.dataclass(frozen=True)
class FlattenParams(LayerParams):
    TYPE: ClassVar[str] = "Flatten"

    def infer_shapes(self, input_shapes: list[Shape], num_outputs: int = 1) -> list[Shape]:
        return [(volume(input_shapes[0]),)]


@dataclasses.dataclass(frozen=True)
class ShuffleChannelParams(_SameShape):
    TYPE: ClassVar[str] = "ShuffleChannel"
    group: int = p_int(0, 1)
    reverse: int = p_int(1)

    def validate(self) -> str | None:
        return f"param 0 (group): must be positive, got {self.group}" if self.group <= 0 else None

    def groups(self, channels: int) -> int:
        """Groups of the shuffle, (groups, c / groups) -> (c / groups, groups): ``group``, or
        ``c / group`` with ``reverse`` (ncnn's inverse shuffle)."""
        return channels // self.group if self.reverse else self.group

    def infer_shapes(self, input_shapes: list[Shape], num_outputs: int = 1) -> list[Shape]:
        shape = input_shapes[0]
        _need_dims(self.TYPE, shape, (3,))
        if shape[0] % self.group:
            raise ShapeError(f"channels {shape[0]} not divisible by group {self.group}")
        return [tuple(shape)]


@dataclasses.dataclass(frozen=True)
class LRNParams(_SameShape):
    TYPE: ClassVar[str] = "LRN"
    region_type: int = p_int(0)
    local_size: int = p_int(1, 5)
    alpha: float = p_float(2, 1.0)
    beta: float = p_float(3, 0.75)
    bias: float = p_float(4, 1.0)

    def validate(self) -> str | None:
        if self.region_type not in (0, 1):
            return f"param 0 (region_type): expected 0 or 1, got {self.region_type}"
        if self.local_size <= 0:
            return f"param 1 (local_size): must be positive, got {self.local_size}"
        return None

    def infer_shapes(self, input_shapes: list[Shape], num_outputs: int = 1) -> list[Shape]:
        _need_dims(self.TYPE, input_shapes[0], (3,))
        return [tuple(input_shapes[0])]


@dataclasses.dataclass(frozen=True)
class ReshapeParams(LayerParams):
    """Target (w, h, d, c); -233 = axis absent (sets the rank), 0 = keep input's, -1 = infer.

    ``shape_expr`` (param 6, pnnx's ``6="0w,-1"``) gives the target instead, as an ncnn shape
    expression (``vkserve.models.shape_expr``) over the dims of the layer's inputs: its values
    are (w), (w, h), (w, h, c) or (w, h, d, c), then 0 and -1 as above. Inputs past the first
    only lend their dims to it.

    ``input_batch_axis`` / ``output_batch_axis`` (params 12 / 13, 233 = none; pnnx writes
    ``12=0 13=0``) select ncnn's batch reshape: the target (from the params or the
    expression, numpy order) is a *logical* shape that holds the batch at
    ``output_batch_axis``, 0 copies the logical input's size at the same position (the input
    with the batch, of 1 here, inserted at ``input_batch_axis``), -1 is inferred; the output is
    that shape without its batch axis, which must be 1 (the engines run a batch of 1)."""

    TYPE: ClassVar[str] = "Reshape"
    INPUTS: ClassVar[tuple[int, int | None]] = (1, None)
    w: int = p_int(0, UNSET)
    h: int = p_int(1, UNSET)
    d: int = p_int(11, UNSET)
    c: int = p_int(2, UNSET)
    shape_expr: str = p_str(6)
    input_batch_axis: int = p_int(12, 233)
    output_batch_axis: int = p_int(13, 233)

    def batch_mode(self) -> bool:
        return self.input_batch_axis != 233 or self.output_batch_axis != 233

    def expression(self) -> ShapeExpression | None:
        return ShapeExpression(self.shape_expr) if self.shape_expr else None

    def arity(self) -> tuple[tuple[int, int | None], tuple[int, int | None]]:
        expr = self.expression()
        return ((max(1, expr.blob_count), None) if expr else (1, 1)), (1, 1)

    def ndim(self) -> int:
        if self.w == UNSET:
            return 0
        if self.h == UNSET:
            return 1
        if self.c == UNSET:
            return 2
        return 3 if self.d == UNSET else 4

    def target(self) -> list[int]:
        """The target dims in numpy order (length = rank)."""
        return {0: [], 1: [self.w], 2: [self.h, self.w], 3: [self.c, self.h, self.w],
                4: [self.c, self.d, self.h, self.w]}[self.ndim()]

    def validate(self) -> str | None:
        if self.shape_expr:
            try:
                expr = ShapeExpression(self.shape_expr)
            except ExpressionError as e:
                return f"param 6: {e}"
            most = 5 if self.batch_mode() else 4
            if not 1 <= len(expr) <= most:
                return (f"param 6: shape expression {self.shape_expr!r} gives {len(expr)} values, "
                        f"not 1..{most}")
            return None
        target = self.target()
        if not target:
            return "Reshape needs param 0 (w)"
        if target.count(-1) > 1 or any(n < -1 for n in target):
            return f"Reshape target {target} may hold one -1 and no other negative values"
        return None

    def resolved_target(self, input_shapes: list[Shape]) -> list[int]:
        """The target in numpy order, the shape expression evaluated for ``input_shapes``."""
        expr = self.expression()
        if expr is None:
            return self.target()
        try:
            values = expr.evaluate([mat_whdc(s) for s in input_shapes])
        except ExpressionError as e:
            raise ShapeError(str(e)) from None
        target = values[::-1]  # (w), (w, h), (w, h, c), (w, h, d, c) reversed: numpy order
        if self.batch_mode():
            return target
        if target.count(-1) > 1 or any(n < -1 for n in target):
            raise ShapeError(f"shape expression {self.shape_expr!r} gives {target} (numpy order): "
                             "one -1 at most and no other negative values")
        return target

    def infer_shapes(self, input_shapes: list[Shape], num_outputs: int = 1) -> list[Shape]:
        if self.batch_mode():
            return [self._infer_batch(input_shapes)]
        shape = input_shapes[0]
        total = volume(shape)
        iw, ih, id_, ic = mat_whdc(shape)
        target = self.resolved_target(input_shapes)
        # 0 keeps the input's Mat field of the same name
        keep = {1: [iw], 2: [ih, iw], 3: [ic, ih, iw], 4: [ic, id_, ih, iw]}[len(target)]
        out = [k if t == 0 else t for t, k in zip(target, keep)]
        if -1 in out:
            known = math.prod(n for n in out if n != -1)
            if known == 0 or total % known:
                raise ShapeError(f"cannot infer -1 reshaping {shape} to {tuple(target)}")
            out[out.index(-1)] = total // known
        if volume(tuple(out)) != total:
            raise ShapeError(f"cannot reshape {shape} ({total} elements) to {tuple(out)}")
        return [_positive(self.TYPE, tuple(out))]

    def _infer_batch(self, input_shapes: list[Shape]) -> Shape:
        """ncnn's Reshape::resolve_batch_shape for a batch of 1 (see the class doc)."""
        shape = tuple(input_shapes[0])
        logical = list(shape)
        if self.input_batch_axis != 233:
            axis = self.input_batch_axis + (len(shape) + 1 if self.input_batch_axis < 0 else 0)
            if not 0 <= axis <= len(shape):
                raise ShapeError(f"input batch axis {self.input_batch_axis} out of range for "
                                 f"a {len(shape)}-D input")
            logical.insert(axis, 1)
        target = self.resolved_target(input_shapes)
        out_axis = self.output_batch_axis
        if out_axis != 233:
            out_axis += len(target) if out_axis < 0 else 0
            if not 0 <= out_axis < len(target):
                raise ShapeError(f"output batch axis {self.output_batch_axis} out of range for "
                                 f"a {len(target)}-D target")
        out: list[int] = []
        for i, n in enumerate(target):
            if n == 0:
                if i >= len(logical):
                    raise ShapeError(f"target {target}: 0 at axis {i} past the input's axes")
                n = logical[i]
            elif n < -1 or (n == -1 and -1 in out):
                raise ShapeError(f"target {target}: one -1 at most and no other negative values")
            out.append(n)
        total = volume(tuple(logical))
        if -1 in out:
            known = math.prod(n for n in out if n != -1)
            if known == 0 or total % known:
                raise ShapeError(f"cannot infer -1 reshaping {shape} to {tuple(target)}")
            out[out.index(-1)] = total // known
        if volume(tuple(out)) != total:
            raise ShapeError(f"cannot reshape {shape} ({total} elements) to {tuple(out)}")
        if out_axis != 233:
            if out[out_axis] != 1:
                raise ShapeError(f"batch reshape of {shape} to {tuple(out)} makes a batch of "
                                 f"{out[out_axis]}; only a batch of 1 runs here")
            del out[out_axis]
        if not 1 <= len(out) <= 4:
            raise ShapeError(f"batch reshape of {shape} gives a {len(out)}-D output")
        return _positive(self.TYPE, tuple(out))

@dataclasses.dataclass(frozen=True)
class SqueezeParams(LayerParams):
    """Drops axes of size 1: those of ``axes`` (numpy axis numbers, negative from the end),
    else those flagged squeeze_w/h/d/c; an axis of another size stays. All gone -> (1,)."""

    TYPE: ClassVar[str] = "Squeeze"
    squeeze_w: int = p_int(0)
    squeeze_h: int = p_int(1)
    squeeze_d: int = p_int(11)
    squeeze_c: int = p_int(2)
    axes: tuple[int, ...] = p_ints(3)

    def infer_shapes(self, input_shapes: list[Shape], num_outputs: int = 1) -> list[Shape]:
        shape = tuple(input_shapes[0])
        dims = len(shape)
        names = {1: "w", 2: "hw", 3: "chw", 4: "cdhw"}[dims]
        if self.axes:
            # ncnn ignores an axis outside the blob's rank
            chosen = {a + dims if a < 0 else a for a in self.axes}
            drop = {a for a in chosen if 0 <= a < dims}
        else:
            flags = {"w": self.squeeze_w, "h": self.squeeze_h, "d": self.squeeze_d,
                     "c": self.squeeze_c}
            drop = {i for i, n in enumerate(names) if flags[n]}
        kept = tuple(n for i, n in enumerate(shape) if i not in drop or n != 1)
        return [kept or (1,)]


@dataclasses.dataclass(frozen=True)
class ExpandDimsParams(LayerParams):
    """Inserts axes of size 1 at ``axes`` (axis numbers of the output, negative from the
    end; ncnn's current ExpandDims reads only param 3)."""

    TYPE: ClassVar[str] = "ExpandDims"
    axes: tuple[int, ...] = p_ints(3)

    def infer_shapes(self, input_shapes: list[Shape], num_outputs: int = 1) -> list[Shape]:
        shape = tuple(input_shapes[0])
        outdims = len(shape) + len(self.axes)
        if outdims > 4:
            raise ShapeError(f"ExpandDims of a {len(shape)}-D input by {len(self.axes)} axes "
                             "gives more than 4 dims")
        axes = [a + outdims if a < 0 else a for a in self.axes]
        if any(not 0 <= a < outdims for a in axes) or len(set(axes)) != len(axes):
            raise ShapeError(f"axes {self.axes} invalid for a {outdims}-D output")
        out, rest = [], iter(shape)
        for i in range(outdims):
            out.append(1 if i in axes else next(rest))
        return [tuple(out)]


@dataclasses.dataclass(frozen=True)
class MemoryDataParams(LayerParams):
    """A constant blob: its w/h/d/c as Input's (the rank is that of the last non-zero of
    d, c, h, w in that order of precedence), its values the layer's one weight; load_type 1
    (default) reads raw float32, 0 a flagged (tagged) weight."""

    TYPE: ClassVar[str] = "MemoryData"
    INPUTS: ClassVar[tuple[int, int | None]] = (0, 0)
    w: int = p_int(0)
    h: int = p_int(1)
    d: int = p_int(11)
    c: int = p_int(2)
    load_type: int = p_int(21, 1)

    def shape(self) -> Shape:
        if self.d:
            return (self.c, self.d, self.h, self.w)
        if self.c:
            return (self.c, self.h, self.w)
        if self.h:
            return (self.h, self.w)
        return (self.w,)

    def validate(self) -> str | None:
        if not (self.w or self.h or self.d or self.c):
            return "MemoryData needs a shape (params 0 w, 1 h, 11 d, 2 c)"
        if any(n <= 0 for n in self.shape()):
            return (f"MemoryData shape w={self.w} h={self.h} d={self.d} c={self.c} has a "
                    "non-positive dimension")
        if self.load_type not in (0, 1):
            return f"param 21 (load_type): expected 0 or 1, got {self.load_type}"
        return None

    def weight_specs(self) -> list[WeightSpec]:
        return [WeightSpec("data", volume(self.shape()), self.load_type == 0)]

    def infer_shapes(self, input_shapes: list[Shape], num_outputs: int = 1) -> list[Shape]:
        return [self.shape()]


# ncnn's Permute order_type tables: output (w, h[, d], c) named by the input axis each comes from
_PERMUTE_ORDERS = {
    2: ["w h", "h w"],
    3: ["w h c", "h w c", "w c h", "c w h", "h c w", "c h w"],
    4: ["w h d c", "h w d c", "w d h c", "d w h c", "h d w c", "d h w c",
        "w h c d", "h w c d", "w c h d", "c w h d", "h c w d", "c h w d",
        "w d c h", "d w c h", "w c d h", "c w d h", "d c w h", "c d w h",
        "h d c w", "d h c w", "h c d w", "c h d w", "d c h w", "c d h w"],
}
_NUMPY_AXIS = {2: {"h": 0, "w": 1}, 3: {"c": 0, "h": 1, "w": 2}, 4: {"c": 0, "d": 1, "h": 2, "w": 3}}


@dataclasses.dataclass(frozen=True)
class PermuteParams(LayerParams):
    TYPE: ClassVar[str] = "Permute"
    order_type: int = p_int(0)

    def numpy_axes(self, dims: int) -> tuple[int, ...]:
        """The ``np.transpose`` axes equivalent to this order_type on a ``dims``-D array."""
        if dims == 1:
            return (0,)
        orders = _PERMUTE_ORDERS[dims]
        if not 0 <= self.order_type < len(orders):
            raise ShapeError(f"order_type {self.order_type} invalid for a {dims}-D input")
        names = orders[self.order_type].split()  # output w, h, ..., c
        return tuple(_NUMPY_AXIS[dims][n] for n in reversed(names))

    def validate(self) -> str | None:
        if not 0 <= self.order_type < 24:
            return f"param 0 (order_type): expected 0..23, got {self.order_type}"
        return None

    def infer_shapes(self, input_shapes: list[Shape], num_outputs: int = 1) -> list[Shape]:
        shape = input_shapes[0]
        return [tuple(shape[a] for a in self.numpy_axes(len(shape)))]


@dataclasses.dataclass(frozen=True)
class CropParams(LayerParams):
    """Offsets + sizes; offsets alone with a second input, whose shape gives the sizes; or
    numpy-style starts/ends/axes, given as arrays (params 9 / 10 / 11) or as ncnn shape
    expressions (params 19 / 20 / 21, pnnx's ``19="1" 20="-(0w,1)" 21="0"``; inputs past the
    first only lend their dims to them). ``window_of`` resolves all of them."""

    TYPE: ClassVar[str] = "Crop"
    INPUTS: ClassVar[tuple[int, int | None]] = (1, None)
    woffset: int = p_int(0)
    hoffset: int = p_int(1)
    doffset: int = p_int(13)
    coffset: int = p_int(2)
    outw: int = p_int(3)
    outh: int = p_int(4)
    outd: int = p_int(14)
    outc: int = p_int(5)
    woffset2: int = p_int(6)
    hoffset2: int = p_int(7)
    doffset2: int = p_int(15)
    coffset2: int = p_int(8)
    starts: tuple[int, ...] = p_ints(9)
    ends: tuple[int, ...] = p_ints(10)
    axes: tuple[int, ...] = p_ints(11)
    starts_expr: str = p_str(19)
    ends_expr: str = p_str(20)
    axes_expr: str = p_str(21)

    def _expression_texts(self) -> tuple[tuple[int, str], ...]:
        return ((19, self.starts_expr), (20, self.ends_expr), (21, self.axes_expr))

    def validate(self) -> str | None:
        for pid, text in self._expression_texts():
            if text:
                try:
                    ShapeExpression(text)
                except ExpressionError as e:
                    return f"param {pid}: {e}"
        if bool(self.starts_expr) != bool(self.ends_expr) or (
                self.axes_expr and not self.starts_expr):
            return "params 19 / 20 (starts / ends expressions): give both (axes, 21, optional)"
        return None

    def numpy_style(self) -> bool:
        return (bool(self.starts) and bool(self.ends)) or bool(self.starts_expr)

    def slices(self, input_shapes: list[Shape]) -> tuple[tuple[int, ...], ...]:
        """(starts, ends, axes) of the numpy style: the arrays, or the expressions evaluated
        for ``input_shapes``."""
        if not self.starts_expr:
            return self.starts, self.ends, self.axes
        blobs = [mat_whdc(s) for s in input_shapes]
        try:
            return tuple(tuple(ShapeExpression(text).evaluate(blobs)) if text else ()
                         for _, text in self._expression_texts())
        except ExpressionError as e:
            raise ShapeError(str(e)) from None

    def uses_reference(self) -> bool:
        """True when the output size comes from a second (reference) input."""
        sizes = (self.outw, self.outh, self.outd, self.outc,
                 self.woffset2, self.hoffset2, self.doffset2, self.coffset2)
        return not self.numpy_style() and not any(sizes)

    def arity(self) -> tuple[tuple[int, int | None], tuple[int, int | None]]:
        if self.uses_reference():
            return (2, 2), (1, 1)
        count = max([1] + [ShapeExpression(text).blob_count
                           for _, text in self._expression_texts() if text])
        return (count, count), (1, 1)

    def window_of(self, input_shapes: list[Shape]) -> tuple[Shape, Shape]:
        """``window`` for the layer's inputs (the reference blob or the expressions' inputs)."""
        reference = input_shapes[1] if self.uses_reference() else None
        return self.window(input_shapes[0], reference, input_shapes)

    def window(self, shape: Shape, reference: Shape | None = None,
               input_shapes: list[Shape] | None = None) -> tuple[Shape, Shape]:
        """(offsets, sizes) in numpy axis order of the crop of an input of ``shape``, as ncnn's
        Crop resolves it (checked against the ncnn package); ShapeError where ncnn's result is
        empty or undefined:

        - offsets + sizes: input - offset - offset2 per axis, capped by out* unless out* is
          -233 (so out* = 0 or negative is an empty crop, which ncnn refuses);
        - with a reference blob: its w/h/d (and c when it has the input's rank) at the given
          offsets; woffset -233 makes ncnn read the window from the reference's data
          (data-dependent), any other offset -233 reads outside the input;
        - numpy style: start / end per axis of ``axes`` (every axis when empty), -233 = open,
          negative = from the end, end 0 = the end; expressions read ``input_shapes``.
        """
        dims = len(shape)
        if self.numpy_style():
            starts, ends, axes = self.slices(input_shapes or [shape])
            offsets, sizes = [0] * dims, list(shape)
            axes = axes or tuple(range(dims))
            if len(starts) < len(axes) or len(ends) < len(axes):
                raise ShapeError(f"{len(axes)} axes but {len(starts)} starts, {len(ends)} ends")
            for i, axis in enumerate(axes):
                axis = positive_axis(axis, dims)
                n = shape[axis]
                start = 0 if starts[i] == UNSET else starts[i]
                end = n if ends[i] == UNSET else ends[i]
                offsets[axis] = start if start >= 0 else n + start
                sizes[axis] = min(n, end if end > 0 else n + end) - offsets[axis]
        elif reference is not None:
            if self.woffset == UNSET:
                raise ShapeError("Crop with offsets read from the reference blob is data-dependent")
            ref_w, ref_h, ref_d, ref_c = mat_whdc(reference)
            c = ref_c if len(reference) == dims else shape[0]
            offsets = self._numpy_order(dims, self.woffset, self.hoffset, self.doffset, self.coffset)
            sizes = self._numpy_order(dims, ref_w, ref_h, ref_d, c)
        else:
            offsets = self._numpy_order(dims, self.woffset, self.hoffset, self.doffset, self.coffset)
            ends = self._numpy_order(dims, self.woffset2, self.hoffset2, self.doffset2, self.coffset2)
            wanted = self._numpy_order(dims, self.outw, self.outh, self.outd, self.outc)
            sizes = [n - off - off2 if want == UNSET else min(want, n - off - off2)
                     for n, off, off2, want in zip(shape, offsets, ends, wanted)]
        for n, off, size in zip(shape, offsets, sizes):
            if off < 0 or size <= 0 or off + size > n:
                raise ShapeError(f"crop offsets {tuple(offsets)} sizes {tuple(sizes)} do not fit "
                                 f"input {shape}")
        return tuple(offsets), tuple(sizes)

    @staticmethod
    def _numpy_order(dims: int, w: int, h: int, d: int, c: int) -> list[int]:
        """Per-axis values named by ncnn's w/h/d/c, for a ``dims``-D blob in numpy order."""
        return {1: [w], 2: [h, w], 3: [c, h, w], 4: [c, d, h, w]}[dims]

    def infer_shapes(self, input_shapes: list[Shape], num_outputs: int = 1) -> list[Shape]:
        return [self.window_of(input_shapes)[1]]


@dataclasses.dataclass(frozen=True)
class InterpParams(LayerParams):
    """resize_type 1 nearest, 2 bilinear, 3 bicubic; output size from output_width/height,
    else int(w * width_scale) (float32 product), or from a second input (dynamic_target_size),
    or from ``size_expr`` (param 9, pnnx's ``9="*(0w,2),*(0h,2)"``: an ncnn shape expression
    giving (outw) or (outw, outh); inputs past the first only lend their dims to it).

    A 3-D blob (c, h, w) resizes to (c, outh, outw); a 2-D blob (h, w) only along w, to
    (h, outw); a 1-D blob (w,) becomes (w, outh, outw), each element filling its channel (ncnn
    reads the sizes of a 1-D blob as w = h = 1)."""

    TYPE: ClassVar[str] = "Interp"
    INPUTS: ClassVar[tuple[int, int | None]] = (1, None)
    resize_type: int = p_int(0)
    height_scale: float = p_float(1, 1.0)
    width_scale: float = p_float(2, 1.0)
    output_height: int = p_int(3)
    output_width: int = p_int(4)
    dynamic_target_size: int = p_int(5)
    align_corner: int = p_int(6)
    size_expr: str = p_str(9)

    def expression(self) -> ShapeExpression | None:
        return ShapeExpression(self.size_expr) if self.size_expr else None

    def validate(self) -> str | None:
        if self.resize_type not in (1, 2, 3):
            return f"param 0 (resize_type): expected 1, 2 or 3, got {self.resize_type}"
        if self.size_expr:
            try:
                expr = ShapeExpression(self.size_expr)
            except ExpressionError as e:
                return f"param 9: {e}"
            if len(expr) not in (1, 2):
                return (f"param 9: size expression {self.size_expr!r} gives {len(expr)} values, "
                        "not 1 (outw) or 2 (outw, outh)")
        return None

    def arity(self) -> tuple[tuple[int, int | None], tuple[int, int | None]]:
        expr = self.expression()
        count = max(2 if self.dynamic_target_size else 1, expr.blob_count if expr else 1)
        return (count, count), (1, 1)

    def output_size(self, shape: Shape, reference: Shape | None = None,
                    input_shapes: list[Shape] | None = None) -> tuple[int, int]:
        """(outh, outw) for an input of ``shape``; ``input_shapes`` (all the layer's inputs)
        feed the size expression."""
        expr = self.expression()
        if expr is not None:
            try:
                values = expr.evaluate([mat_whdc(s) for s in (input_shapes or [shape])])
            except ExpressionError as e:
                raise ShapeError(str(e)) from None
            return (values[1] if len(values) > 1 else mat_whdc(shape)[1]), values[0]
        if reference is not None:
            ref_w, ref_h, _, _ = mat_whdc(reference)
            return ref_h, ref_w
        w, h, _, _ = mat_whdc(shape)
        if len(shape) == 1:
            w = h = 1
        outw, outh = self.output_width, self.output_height
        if outw == 0 or outh == 0:
            with np.errstate(over="ignore"):
                scaled_w = np.float32(w) * np.float32(self.width_scale)
                scaled_h = np.float32(h) * np.float32(self.height_scale)
            if not (np.isfinite(scaled_w) and np.isfinite(scaled_h)):
                raise ShapeError(f"scales {self.height_scale}, {self.width_scale} overflow")
            outw, outh = int(scaled_w), int(scaled_h)
        return outh, outw

    def source_steps(self, in_hw: tuple[int, int], out_hw: tuple[int, int]) -> tuple[float, float]:
        """(h, w) step in input pixels per output pixel, as ncnn resizes: with align_corner
        (bilinear, bicubic) (in - 1) / (out - 1), 0 for one output pixel; where the output
        size was given (a reference, a size expression or output_height; for bilinear and
        bicubic also output_width) in / out; else 1 / scale (so 9 columns halved to 4 step by
        2, not 2.25)."""
        (h, w), (outh, outw) = in_hw, out_hw
        if self.resize_type != 1 and self.align_corner:
            return ((h - 1) / (outh - 1) if outh > 1 else 0.0,
                    (w - 1) / (outw - 1) if outw > 1 else 0.0)
        if self.dynamic_target_size or self.size_expr or self.output_height or (
                self.resize_type != 1 and self.output_width):
            return h / outh, w / outw
        return 1.0 / float(np.float32(self.height_scale)), 1.0 / float(np.float32(self.width_scale))

    def infer_shapes(self, input_shapes: list[Shape], num_outputs: int = 1) -> list[Shape]:
        shape = input_shapes[0]
        _need_dims(self.TYPE, shape, (1, 2, 3))
        reference = input_shapes[1] if self.dynamic_target_size else None
        outh, outw = self.output_size(shape, reference, input_shapes)
        if len(shape) == 1:
            out: Shape = (shape[0], outh, outw)
        elif len(shape) == 2:
            out = (shape[0], outw)
        else:
            out = (shape[0], outh, outw)
        return [_positive(self.TYPE, out)]


@dataclasses.dataclass(frozen=True)
class PaddingParams(LayerParams):
    """type 0 constant, 1 replicate, 2 reflect; front/behind pad channels (3-D) or depth (4-D)."""

    TYPE: ClassVar[str] = "Padding"
    top: int = p_int(0)
    bottom: int = p_int(1)
    left: int = p_int(2)
    right: int = p_int(3)
    type: int = p_int(4)
    value: float = p_float(5)
    per_channel_pad_data_size: int = p_int(6)
    front: int = p_int(7)
    behind: int = p_int(8)

    def validate(self) -> str | None:
        if self.type not in (0, 1, 2):
            return f"param 4 (type): expected 0, 1 or 2, got {self.type}"
        pads = (self.top, self.bottom, self.left, self.right, self.front, self.behind)
        if any(p < 0 for p in pads) or self.per_channel_pad_data_size < 0:
            return "Padding sizes must not be negative"
        return None

    def weight_specs(self) -> list[WeightSpec]:
        if self.per_channel_pad_data_size:
            return [WeightSpec("per_channel_pad_data", self.per_channel_pad_data_size, False)]
        return []

    def pads(self, dims: int) -> list[tuple[int, int]]:
        """(before, after) per numpy axis of a ``dims``-D blob: left/right on w, top/bottom on
        h, front/behind on the channels of a 3-D blob and on the depth of a 4-D one."""
        hw = [(self.top, self.bottom), (self.left, self.right)]
        return {1: hw[1:], 2: hw, 3: [(self.front, self.behind), *hw],
                4: [(0, 0), (self.front, self.behind), *hw]}[dims]

    def infer_shapes(self, input_shapes: list[Shape], num_outputs: int = 1) -> list[Shape]:
        shape = input_shapes[0]
        out = tuple(n + a + b for n, (a, b) in zip(shape, self.pads(len(shape))))
        if 0 < self.per_channel_pad_data_size < out[0] and len(shape) >= 3:
            raise ShapeError(f"param 6 (per_channel_pad_data_size): {self.per_channel_pad_data_size} "
                             f"values for {out[0]} output channels")
        return [out]


@dataclasses.dataclass(frozen=True)
class Yolov3DetectionOutputParams(LayerParams):
    """Decodes YOLO heads into rows of (label, score, xmin, ymin, xmax, ymax), normalised.

    ``mask`` and ``anchors_scale`` are float arrays; ncnn reads int elements as float32 bit
    patterns (yolov4-tiny writes ``-23305=6,1077936128,...`` = 3.0, 4.0, ...). The row count is
    data-dependent: ``infer_shapes`` gives the upper bound (every candidate box kept)."""

    TYPE: ClassVar[str] = "Yolov3DetectionOutput"
    INPUTS: ClassVar[tuple[int, int | None]] = (1, None)
    num_class: int = p_int(0, 20)
    num_box: int = p_int(1, 5)
    confidence_threshold: float = p_float(2, 0.01)
    nms_threshold: float = p_float(3, 0.45)
    biases: tuple[float, ...] = p_floats(4)
    mask: tuple[float, ...] = p_floats(5)
    anchors_scale: tuple[float, ...] = p_floats(6)

    def validate(self) -> str | None:
        if self.num_class <= 0 or self.num_box <= 0:
            return "num_class and num_box must be positive"
        for i, m in enumerate(self.mask):
            if not (math.isfinite(m) and m == int(m) and 0 <= m and 2 * int(m) + 1 < len(self.biases)):
                return f"param 5 (mask): entry {i} = {m} does not index a bias pair"
        return None

    def infer_shapes(self, input_shapes: list[Shape], num_outputs: int = 1) -> list[Shape]:
        if len(self.anchors_scale) < len(input_shapes):
            raise ShapeError(f"{len(input_shapes)} inputs but {len(self.anchors_scale)} anchors_scale")
        if len(self.mask) < self.num_box * len(input_shapes):
            raise ShapeError(f"mask has {len(self.mask)} entries, needs {self.num_box} per input")
        candidates = 0
        for shape in input_shapes:
            _need_dims(self.TYPE, shape, (3,))
            c, h, w = shape
            if c != self.num_box * (5 + self.num_class):
                raise ShapeError(
                    f"input {shape}: expected {self.num_box} x (5 + {self.num_class}) channels"
                )
            candidates += self.num_box * h * w
        return [(candidates, 6)]


# ---------------------------------------------------------------------------------------------
# per-channel affine layers (BatchNorm, Scale, Bias)


def affine_channels(shape: Shape) -> int:
    """Channels of BatchNorm / Scale: ncnn takes w of a 1-D blob, h of a 2-D one and c of a
    3-D / 4-D one, i.e. numpy axis 0 for every rank (each channel is a contiguous run)."""
    return shape[0]


def batchnorm_affine(slope: np.ndarray, mean: np.ndarray, var: np.ndarray, bias: np.ndarray,
                     eps: float) -> tuple[np.ndarray, np.ndarray]:
    """(scale, shift) with y = x * scale + shift, in float32 as ncnn's BatchNorm::load_model:
    sqrt_var = sqrt(var + eps) (0 replaced by 0.0001), shift = bias - slope * mean / sqrt_var,
    scale = slope / sqrt_var."""
    f = np.float32
    var32 = np.asarray(var, f) + f(eps)
    sqrt_var = np.sqrt(var32.astype(np.float64)).astype(f)
    sqrt_var = np.where(sqrt_var == 0, f(0.0001), sqrt_var).astype(f)
    slope32 = np.asarray(slope, f)
    shift = (np.asarray(bias, f) - (slope32 * np.asarray(mean, f)) / sqrt_var).astype(f)
    scale = (slope32 / sqrt_var).astype(f)
    return scale, shift


@dataclasses.dataclass(frozen=True)
class BatchNormParams(_SameShape):
    TYPE: ClassVar[str] = "BatchNorm"
    channels: int = p_int(0)
    eps: float = p_float(1, 0.0)

    def validate(self) -> str | None:
        if self.channels <= 0:
            return f"param 0 (channels): must be positive, got {self.channels}"
        return None

    def weight_specs(self) -> list[WeightSpec]:
        return [WeightSpec(name, self.channels, False)
                for name in ("slope_data", "mean_data", "var_data", "bias_data")]

    def infer_shapes(self, input_shapes: list[Shape], num_outputs: int = 1) -> list[Shape]:
        shape = input_shapes[0]
        _need_dims(self.TYPE, shape, (1, 2, 3, 4))
        if affine_channels(shape) != self.channels:
            raise ShapeError(f"BatchNorm of {self.channels} channels got input {shape}")
        return [tuple(shape)]


@dataclasses.dataclass(frozen=True)
class ScaleParams(LayerParams):
    """scale_data_size -233: two inputs, the second (1-D, one value per channel) is the scale
    (no bias then: ncnn loads none)."""

    TYPE: ClassVar[str] = "Scale"
    INPUTS: ClassVar[tuple[int, int | None]] = (1, 2)
    scale_data_size: int = p_int(0)
    bias_term: int = p_int(1)

    @property
    def scale_input(self) -> bool:
        return self.scale_data_size == UNSET

    def validate(self) -> str | None:
        if self.scale_input:
            if self.bias_term:
                return "param 1 (bias_term): no bias with a scale input (param 0 = -233)"
            return None
        if self.scale_data_size <= 0:
            return f"param 0 (scale_data_size): must be positive or -233, got {self.scale_data_size}"
        return None

    def arity(self) -> tuple[tuple[int, int | None], tuple[int, int | None]]:
        return ((2, 2) if self.scale_input else (1, 1)), self.OUTPUTS

    def weight_specs(self) -> list[WeightSpec]:
        if self.scale_input:
            return []
        specs = [WeightSpec("scale_data", self.scale_data_size, False)]
        if self.bias_term:
            specs.append(WeightSpec("bias_data", self.scale_data_size, False))
        return specs

    def infer_shapes(self, input_shapes: list[Shape], num_outputs: int = 1) -> list[Shape]:
        shape = input_shapes[0]
        _need_dims(self.TYPE, shape, (1, 2, 3, 4))
        channels = affine_channels(shape)
        if self.scale_input:
            if tuple(input_shapes[1]) != (channels,):
                raise ShapeError(f"Scale input {shape} needs a scale blob of shape ({channels},), "
                                 f"got {input_shapes[1]}")
        elif channels != self.scale_data_size:
            raise ShapeError(f"Scale of {self.scale_data_size} channels got input {shape}")
        return [tuple(shape)]


def bias_channels(shape: Shape) -> int:
    """Channels of the Bias layer: c of a 3-D / 4-D blob; a 1-D / 2-D blob is one channel
    (ncnn adds bias_data[0] to all of it)."""
    return shape[0] if len(shape) >= 3 else 1


@dataclasses.dataclass(frozen=True)
class BiasParams(_SameShape):
    TYPE: ClassVar[str] = "Bias"
    bias_data_size: int = p_int(0)

    def validate(self) -> str | None:
        if self.bias_data_size <= 0:
            return f"param 0 (bias_data_size): must be positive, got {self.bias_data_size}"
        return None

    def weight_specs(self) -> list[WeightSpec]:
        return [WeightSpec("bias_data", self.bias_data_size, False)]

    def infer_shapes(self, input_shapes: list[Shape], num_outputs: int = 1) -> list[Shape]:
        shape = input_shapes[0]
        _need_dims(self.TYPE, shape, (1, 2, 3, 4))
        if bias_channels(shape) > self.bias_data_size:
            raise ShapeError(f"Bias of {self.bias_data_size} values got input {shape}")
        return [tuple(shape)]


# ---------------------------------------------------------------------------------------------
# normalisation layers (LayerNorm, RMSNorm, GroupNorm, InstanceNorm)


@dataclasses.dataclass(frozen=True)
class _LastDimsNorm(_SameShape):
    """LayerNorm / RMSNorm: each run of the last ``norm_dims`` axes is normalised on its own;
    gamma (and beta) have one value per element of a run."""

    affine_size: int = p_int(0)
    eps: float = p_float(1, 0.001)
    affine: int = p_int(2, 1)

    def norm_dims(self, shape: Shape) -> int:
        """How many trailing axes one normalised run spans, as ncnn picks it: the last axis of
        a 1-D / 2-D blob; of a 3-D blob w (affine_size == w) else h*w; of a 4-D blob w,
        h*w (affine_size == h*w) else d*h*w."""
        if len(shape) <= 2 or self.affine_size == shape[-1]:
            return 1
        if len(shape) == 3 or self.affine_size == shape[-1] * shape[-2]:
            return 2
        return 3

    def infer_shapes(self, input_shapes: list[Shape], num_outputs: int = 1) -> list[Shape]:
        shape = input_shapes[0]
        _need_dims(self.TYPE, shape, (1, 2, 3, 4))
        run = volume(shape[len(shape) - self.norm_dims(shape):])
        if self.affine and self.affine_size != run:
            raise ShapeError(f"{self.TYPE} of affine_size {self.affine_size} got input {shape} "
                             f"(normalises runs of {run})")
        return [tuple(shape)]


@dataclasses.dataclass(frozen=True)
class LayerNormParams(_LastDimsNorm):
    TYPE: ClassVar[str] = "LayerNorm"

    def weight_specs(self) -> list[WeightSpec]:
        if not self.affine:
            return []
        return [WeightSpec("gamma_data", self.affine_size, False),
                WeightSpec("beta_data", self.affine_size, False)]


@dataclasses.dataclass(frozen=True)
class RMSNormParams(_LastDimsNorm):
    TYPE: ClassVar[str] = "RMSNorm"

    def weight_specs(self) -> list[WeightSpec]:
        return [WeightSpec("gamma_data", self.affine_size, False)] if self.affine else []


@dataclasses.dataclass(frozen=True)
class GroupNormParams(_SameShape):
    """Channels (numpy axis 0 at every rank: w of a 1-D blob, h of a 2-D one) split into
    ``group`` contiguous groups, each normalised on its own; gamma / beta per channel."""

    TYPE: ClassVar[str] = "GroupNorm"
    group: int = p_int(0, 1)
    channels: int = p_int(1)
    eps: float = p_float(2, 0.001)
    affine: int = p_int(3, 1)

    def validate(self) -> str | None:
        if self.group <= 0:
            return f"param 0 (group): must be positive, got {self.group}"
        if self.channels <= 0 or self.channels % self.group:
            return (f"param 1 (channels): {self.channels} is not a positive multiple of "
                    f"group {self.group}")
        return None

    def weight_specs(self) -> list[WeightSpec]:
        if not self.affine:
            return []
        return [WeightSpec("gamma_data", self.channels, False),
                WeightSpec("beta_data", self.channels, False)]

    def infer_shapes(self, input_shapes: list[Shape], num_outputs: int = 1) -> list[Shape]:
        shape = input_shapes[0]
        _need_dims(self.TYPE, shape, (1, 2, 3, 4))
        if shape[0] != self.channels:
            raise ShapeError(f"GroupNorm of {self.channels} channels got input {shape}")
        return [tuple(shape)]


@dataclasses.dataclass(frozen=True)
class InstanceNormParams(_SameShape):
    """Each channel of a 3-D / 4-D blob normalised on its own; gamma / beta per channel."""

    TYPE: ClassVar[str] = "InstanceNorm"
    channels: int = p_int(0)
    eps: float = p_float(1, 0.001)
    affine: int = p_int(2, 1)

    def validate(self) -> str | None:
        if self.channels <= 0:
            return f"param 0 (channels): must be positive, got {self.channels}"
        return None

    def weight_specs(self) -> list[WeightSpec]:
        if not self.affine:
            return []
        return [WeightSpec("gamma_data", self.channels, False),
                WeightSpec("beta_data", self.channels, False)]

    def infer_shapes(self, input_shapes: list[Shape], num_outputs: int = 1) -> list[Shape]:
        shape = input_shapes[0]
        _need_dims(self.TYPE, shape, (3, 4))
        if shape[0] != self.channels:
            raise ShapeError(f"InstanceNorm of {self.channels} channels got input {shape}")
        return [tuple(shape)]


REDUCTION_OPS = {0: "sum", 1: "asum", 2: "sumsq", 3: "mean", 4: "max", 5: "min", 6: "prod",
                 7: "l1", 8: "l2", 9: "logsum", 10: "logsumexp"}


@dataclasses.dataclass(frozen=True)
class ReductionParams(LayerParams):
    """Reduces the ``reduce_axes`` of the input (all of them with reduce_all; numpy axes of
    the batch-less blob, negatives from the end) with ``operation``, then multiplies by
    ``coeff`` (mean: sum / count * coeff; l2 / logsum / logsumexp: after the sqrt / log).
    keepdims keeps the rank with 1s; otherwise the reduced axes go ((1,) when none is left).
    reduce_all=0 with no axes reduces nothing (the element-wise op, e.g. asum -> abs), except
    that a 1-D blob is always reduced whole (as ncnn does).
    ncnn refuses axes without fixbug0=1 (the old numbering counted the batch axis)."""

    TYPE: ClassVar[str] = "Reduction"
    operation: int = p_int(0, 0)
    reduce_all: int = p_int(1, 1)
    coeff: float = p_float(2, 1.0)
    axes: tuple[int, ...] = p_ints(3)
    keepdims: int = p_int(4, 0)
    fixbug0: int = p_int(5, 0)

    def validate(self) -> str | None:
        if self.operation not in REDUCTION_OPS:
            return f"param 0 (operation): unknown operation {self.operation}"
        if self.axes and not self.fixbug0:
            return "param 3 (axes) given without 5=1 (fixbug0): old axis numbering, regenerate the param"
        return None

    def reduce_axes(self, shape: Shape) -> tuple[int, ...]:
        dims = len(shape)
        if self.reduce_all or dims == 1:  # ncnn reduces a 1-D blob whole, even with no axes
            return tuple(range(dims))
        out = set()
        for a in self.axes:
            if not -dims <= a < dims:
                raise ShapeError(f"Reduction axis {a} out of range for a {dims}-D input")
            out.add(a + dims if a < 0 else a)
        return tuple(sorted(out))

    def infer_shapes(self, input_shapes: list[Shape], num_outputs: int = 1) -> list[Shape]:
        shape = tuple(input_shapes[0])
        _need_dims(self.TYPE, shape, (1, 2, 3, 4))
        red = self.reduce_axes(shape)
        if self.keepdims:
            return [tuple(1 if i in red else n for i, n in enumerate(shape))]
        kept = tuple(n for i, n in enumerate(shape) if i not in red)
        return [kept or (1,)]


def gemm_matrix(layer: str, shape: Shape) -> tuple[int, int]:
    """(rows, cols) of a Gemm operand as ncnn reads it: a 1-D blob is one row, a 2-D blob (h, w),
    a 3-D blob (c, 1, w) has c rows (the N1M form); anything else is refused."""
    if len(shape) == 1:
        return 1, shape[0]
    if len(shape) == 2:
        return shape[0], shape[1]
    if len(shape) == 3 and shape[1] == 1:
        return shape[0], shape[2]
    raise ShapeError(f"{layer} operand {shape}: expected 1-D, 2-D or (c, 1, w) 3-D")


@dataclasses.dataclass(frozen=True)
class GemmParams(LayerParams):
    """top = alpha * (A @ B + beta * C) (ncnn's order: C scaled by beta, then the product added,
    then all scaled by alpha). A is (M, K) (stored (K, M) with transA), B is (K, N) (stored
    (N, K) with transB); each is an input or a weight (constantA / constantB, shaped by
    constantM / N / K); C is optional: a weight of constant_broadcast_type_C (0 scalar, 1 / 2
    per row, 3 (M, N), 4 per column; -1 none) or the last input, its broadcast picked from its
    shape as ncnn does. The output is (M, N), (M, 1, N) with output_N1M, transposed with
    output_transpose. output_elempack / output_elemtype are storage hints and change no value."""

    TYPE: ClassVar[str] = "Gemm"
    UNSUPPORTED: ClassVar[dict[int, str]] = {18: "int8_scale_term (int8 quantized Gemm)"}
    INPUTS: ClassVar[tuple[int, int | None]] = (1, 3)
    alpha: float = p_float(0, 1.0)
    beta: float = p_float(1, 1.0)
    transA: int = p_int(2)
    transB: int = p_int(3)
    constantA: int = p_int(4)
    constantB: int = p_int(5)
    constantC: int = p_int(6)
    constantM: int = p_int(7)
    constantN: int = p_int(8)
    constantK: int = p_int(9)
    constant_broadcast_type_C: int = p_int(10)
    output_N1M: int = p_int(11)
    output_elempack: int = p_int(12)
    output_elemtype: int = p_int(13)
    output_transpose: int = p_int(14)

    def validate(self) -> str | None:
        need = []
        if self.constantA:
            need += [(7, "constantM", self.constantM), (9, "constantK", self.constantK)]
        if self.constantB:
            need += [(8, "constantN", self.constantN), (9, "constantK", self.constantK)]
        if self.has_constant_c():
            if not -1 <= self.constant_broadcast_type_C <= 4:
                return (f"param 10 (constant_broadcast_type_C): expected -1 to 4, got "
                        f"{self.constant_broadcast_type_C}")
            if self.constant_broadcast_type_C in (1, 2, 3):
                need.append((7, "constantM", self.constantM))
            if self.constant_broadcast_type_C in (3, 4):
                need.append((8, "constantN", self.constantN))
        for pid, name, value in need:
            if value <= 0:
                return f"param {pid} ({name}): must be positive for a constant operand, got {value}"
        return None

    def has_constant_c(self) -> bool:
        return bool(self.constantC) and self.constant_broadcast_type_C != -1

    def operand_inputs(self) -> int:
        """How many inputs are A / B (the rest, at most one, is C)."""
        return int(not self.constantA) + int(not self.constantB)

    def arity(self) -> tuple[tuple[int, int | None], tuple[int, int | None]]:
        n = self.operand_inputs()
        return (n, n if self.constantC else n + 1), self.OUTPUTS

    def c_count(self) -> int:
        m, n = self.constantM, self.constantN
        return {0: 1, 1: m, 2: m, 3: m * n, 4: n}[self.constant_broadcast_type_C]

    def weight_specs(self) -> list[WeightSpec]:
        specs = []
        if self.constantA:
            specs.append(WeightSpec("A_data", self.constantM * self.constantK, True))
        if self.constantB:
            specs.append(WeightSpec("B_data", self.constantN * self.constantK, True))
        if self.has_constant_c():
            specs.append(WeightSpec("C_data", self.c_count(), True))
        return specs

    def dims(self, input_shapes: list[Shape]) -> tuple[int, int, int, int]:
        """(M, N, K, broadcast type of C or -1 for none) for these input shapes."""
        shapes = list(input_shapes)
        if self.constantA:
            a = (self.constantK, self.constantM) if self.transA else (self.constantM, self.constantK)
        else:
            a = gemm_matrix(self.TYPE, shapes.pop(0))
        if self.constantB:
            b = (self.constantN, self.constantK) if self.transB else (self.constantK, self.constantN)
        else:
            b = gemm_matrix(self.TYPE, shapes.pop(0))
        m, ka = (a[1], a[0]) if self.transA else a
        kb, n = (b[1], b[0]) if self.transB else b
        if ka != kb:
            raise ShapeError(f"Gemm: A is {m}x{ka} but B is {kb}x{n} (transA={self.transA}, "
                             f"transB={self.transB})")
        if self.constantC:
            return m, n, ka, self.constant_broadcast_type_C
        if not shapes:
            return m, n, ka, -1
        c = shapes[0]
        kind = -1
        if len(c) == 1 and c[0] == 1:
            kind = 0
        if len(c) == 1 and c[0] == m:
            kind = 1
        if len(c) == 1 and c[0] == n:
            kind = 4
        if len(c) == 2 and c[1] == 1 and c[0] == m:
            kind = 2
        if len(c) == 2 and c[1] == n and c[0] == m:
            kind = 3
        if len(c) == 2 and c[1] == n and c[0] == 1:
            kind = 4
        if kind < 0:
            raise ShapeError(f"Gemm: C {c} broadcasts over neither M={m} nor N={n}")
        return m, n, ka, kind

    def infer_shapes(self, input_shapes: list[Shape], num_outputs: int = 1) -> list[Shape]:
        m, n, _k, _c = self.dims(input_shapes)
        rows, cols = (n, m) if self.output_transpose else (m, n)
        return [(rows, 1, cols) if self.output_N1M else (rows, cols)]


@dataclasses.dataclass(frozen=True)
class PixelShuffleParams(LayerParams):
    """Depth to space of a 3-D blob: (c, h, w) -> (c / r^2, h * r, w * r) (the channel count
    floored, as ncnn). mode 0 (PyTorch): output channel p, row offset sh, column offset sw read
    input channel p * r^2 + sh * r + sw; mode 1: (sh * r + sw) * (c / r^2) + p."""

    TYPE: ClassVar[str] = "PixelShuffle"
    upscale_factor: int = p_int(0, 1)
    mode: int = p_int(1, 0)

    def validate(self) -> str | None:
        if self.upscale_factor <= 0:
            return f"param 0 (upscale_factor): must be positive, got {self.upscale_factor}"
        if self.mode not in (0, 1):
            return f"param 1 (mode): must be 0 or 1, got {self.mode}"
        return None

    def infer_shapes(self, input_shapes: list[Shape], num_outputs: int = 1) -> list[Shape]:
        shape = input_shapes[0]
        _need_dims(self.TYPE, shape, (3,))
        r = self.upscale_factor
        c, h, w = shape
        return [_positive(self.TYPE, (c // (r * r), h * r, w * r))]


@dataclasses.dataclass(frozen=True)
class ReorgParams(LayerParams):
    """Space to depth of a 3-D blob: (c, h, w) -> (c * s^2, h / s, w / s) (floored, as ncnn;
    trailing rows / columns dropped). mode 0: output channel q * s^2 + sh * s + sw of input
    channel q takes rows i * s + sh, columns j * s + sw; mode 1: channel (sh * s + sw) * c + q."""

    TYPE: ClassVar[str] = "Reorg"
    stride: int = p_int(0, 1)
    mode: int = p_int(1, 0)

    def validate(self) -> str | None:
        if self.stride <= 0:
            return f"param 0 (stride): must be positive, got {self.stride}"
        if self.mode not in (0, 1):
            return f"param 1 (mode): must be 0 or 1, got {self.mode}"
        return None

    def infer_shapes(self, input_shapes: list[Shape], num_outputs: int = 1) -> list[Shape]:
        shape = input_shapes[0]
        _need_dims(self.TYPE, shape, (3,))
        s = self.stride
        c, h, w = shape
        return [_positive(self.TYPE, (c * s * s, h // s, w // s))]


@dataclasses.dataclass(frozen=True)
class GLUParams(LayerParams):
    """Halves the input along ``axis`` (ncnn numbering, negatives from the end) into a, b and
    outputs a * sigmoid(b); the axis must have an even size."""

    TYPE: ClassVar[str] = "GLU"
    axis: int = p_int(0, 0)

    def infer_shapes(self, input_shapes: list[Shape], num_outputs: int = 1) -> list[Shape]:
        shape = tuple(input_shapes[0])
        _need_dims(self.TYPE, shape, (1, 2, 3, 4))
        axis = positive_axis(self.axis, len(shape))
        if shape[axis] % 2:
            raise ShapeError(f"GLU axis {self.axis} of {shape} has an odd size")
        return [shape[:axis] + (shape[axis] // 2,) + shape[axis + 1:]]


@dataclasses.dataclass(frozen=True)
class MatMulParams(LayerParams):
    """numpy's matmul of two 1-D to 4-D inputs (B's last two axes swapped first with transB):
    leading batch axes broadcast, a 1-D A is one row and a 1-D B one column (their axis
    dropped from the output); 1-D times 1-D gives a (1,) blob, as ncnn does."""

    TYPE: ClassVar[str] = "MatMul"
    INPUTS: ClassVar[tuple[int, int | None]] = (2, 2)
    transB: int = p_int(0)

    def dims(self, input_shapes: list[Shape]) -> tuple[Shape, int, int, int, Shape, Shape]:
        """(batch axes of the output, M, N, K, A's batch axes, B's batch axes), batch axes
        padded to two with leading 1s."""
        a, b = (tuple(s) for s in input_shapes[:2])
        for name, s in (("A", a), ("B", b)):
            if not 1 <= len(s) <= 4:
                raise ShapeError(f"MatMul {name} {s}: expected 1-D to 4-D")
        m, ka = (1, a[0]) if len(a) == 1 else a[-2:]
        if len(b) == 1:
            kb, n = b[0], 1
        else:
            kb, n = (b[-1], b[-2]) if self.transB else b[-2:]
        if ka != kb:
            raise ShapeError(f"MatMul: A {a} and B {b} (transB={self.transB}) disagree on K")
        a_batch = (1, 1, *a[:-2])[-2:]
        b_batch = (1, 1, *b[:-2])[-2:]
        out_batch = []
        for x, y in zip(a_batch, b_batch):
            if x != y and 1 not in (x, y):
                raise ShapeError(f"MatMul: batch axes of A {a} and B {b} do not broadcast")
            out_batch.append(max(x, y))
        return tuple(out_batch), m, n, ka, a_batch, b_batch

    def infer_shapes(self, input_shapes: list[Shape], num_outputs: int = 1) -> list[Shape]:
        a, b = input_shapes[:2]
        out_batch, m, n, _k, _ab, _bb = self.dims(input_shapes)
        if len(a) == 1 and len(b) == 1:
            return [(1,)]
        lead = max(len(a), len(b)) - 2
        rows = () if len(a) == 1 else (m,)
        cols = () if len(b) == 1 else (n,)
        return [tuple(out_batch[2 - lead:]) + rows + cols] if lead > 0 else [rows + cols]


@dataclasses.dataclass(frozen=True)
class TileParams(LayerParams):
    """Repeats the input: with ``repeats`` (up to 4) as numpy.tile (the shorter of input rank
    and repeats padded in front with 1s), except that a 3-D (c, h, w) input with 4 repeats is
    seen as (c, 1, h, w), as ncnn does; without repeats, ``tiles`` copies along ``axis``."""

    TYPE: ClassVar[str] = "Tile"
    axis: int = p_int(0, 0)
    tiles: int = p_int(1, 1)
    repeats: tuple[int, ...] = p_ints(2)

    def validate(self) -> str | None:
        if self.repeats:
            if len(self.repeats) > 4:
                return f"param 2 (repeats): at most 4 values, got {len(self.repeats)}"
            if any(r <= 0 for r in self.repeats):
                return f"param 2 (repeats): must be positive, got {list(self.repeats)}"
            return None
        if self.axis < 0:
            return f"param 0 (axis): must not be negative, got {self.axis}"
        if self.tiles <= 0:
            return f"param 1 (tiles): must be positive, got {self.tiles}"
        return None

    def tile_plan(self, shape: Shape) -> tuple[Shape, tuple[int, ...]]:
        """(the input shape as the output's rank, the repeat of each axis)."""
        shape = tuple(shape)
        dims = len(shape)
        if not self.repeats:
            if self.axis >= dims:
                raise ShapeError(f"Tile axis {self.axis} out of range for a {dims}-D input")
            return shape, tuple(self.tiles if i == self.axis else 1 for i in range(dims))
        reps = tuple(self.repeats)
        rank = max(dims, len(reps))
        if dims == 3 and len(reps) == 4:
            padded: Shape = (shape[0], 1, shape[1], shape[2])
        else:
            padded = (1,) * (rank - dims) + shape
        return padded, (1,) * (rank - len(reps)) + reps

    def infer_shapes(self, input_shapes: list[Shape], num_outputs: int = 1) -> list[Shape]:
        _need_dims(self.TYPE, input_shapes[0], (1, 2, 3, 4))
        padded, reps = self.tile_plan(input_shapes[0])
        return [tuple(n * r for n, r in zip(padded, reps))]


@dataclasses.dataclass(frozen=True)
class MultiHeadAttentionParams(LayerParams):
    """torch.nn.MultiheadAttention on 2-D blobs (a 1-D one is one row; ncnn misreads 3-D
    ones, they are refused). Inputs: q (src, qdim) alone (k = v = q),
    q + kv (k = v), or q, k, v ((seq, kdim), (seq, vdim), one seq); with attn_mask one more
    input, last: (src, seq), added to every head's scores, or (num_heads, src, seq), one per
    head. Each projection is x @ W^T + b with W stored (embed_dim, in dim) (the out projection
    (qdim, embed_dim)); q's projection is multiplied by ``scale`` (default 1 / sqrt(embed_dim /
    num_heads), integer division as ncnn). Per head: softmax(q_h k_h^T + mask) v_h; the heads
    are concatenated and projected back to (src, qdim), qdim = weight_data_size / embed_dim.
    kv_cache (past keys / values as extra inputs and outputs) and quantized weights are
    refused."""

    TYPE: ClassVar[str] = "MultiHeadAttention"
    INPUTS: ClassVar[tuple[int, int | None]] = (1, 3)
    embed_dim: int = p_int(0)
    num_heads: int = p_int(1, 1)
    weight_data_size: int = p_int(2)
    kdim: int = p_int(3, fallback="embed_dim")
    vdim: int = p_int(4, fallback="embed_dim")
    attn_mask: int = p_int(5)
    scale: float | None = p_float(6, None)  # type: ignore[arg-type]
    kv_cache: int = p_int(7)
    quantize_term: int = p_int(18)

    def validate(self) -> str | None:
        if self.embed_dim <= 0:
            return f"param 0 (embed_dim): must be positive, got {self.embed_dim}"
        if self.num_heads <= 0 or self.embed_dim % self.num_heads:
            return (f"param 1 (num_heads): {self.num_heads} does not divide embed_dim "
                    f"{self.embed_dim}")
        if self.weight_data_size <= 0 or self.weight_data_size % self.embed_dim:
            return (f"param 2 (weight_data_size): {self.weight_data_size} is not a positive "
                    f"multiple of embed_dim {self.embed_dim}")
        for pid, name in ((3, "kdim"), (4, "vdim")):
            if getattr(self, name) <= 0:
                return f"param {pid} ({name}): must be positive, got {getattr(self, name)}"
        if self.kv_cache:
            return "param 7 (kv_cache): attention with a key / value cache is not supported"
        if self.quantize_term:
            return "param 18 (quantize_term): quantized attention weights are not supported"
        return None

    def arity(self) -> tuple[tuple[int, int | None], tuple[int, int | None]]:
        extra = 1 if self.attn_mask else 0
        return (1 + extra, 3 + extra), self.OUTPUTS

    def qdim(self) -> int:
        return self.weight_data_size // self.embed_dim

    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    def qk_scale(self) -> float:
        """The factor of q's projection: param 6, or ncnn's default (in float32)."""
        if self.scale is not None:
            return self.scale
        return float(np.float32(1.0) / np.sqrt(np.float32(self.head_dim())))

    def weight_specs(self) -> list[WeightSpec]:
        e = self.embed_dim
        return [WeightSpec("q_weight_data", e * self.qdim(), True),
                WeightSpec("q_bias_data", e, False),
                WeightSpec("k_weight_data", e * self.kdim, True),
                WeightSpec("k_bias_data", e, False),
                WeightSpec("v_weight_data", e * self.vdim, True),
                WeightSpec("v_bias_data", e, False),
                WeightSpec("out_weight_data", self.qdim() * e, True),
                WeightSpec("out_bias_data", self.qdim(), False)]

    def roles(self, count: int) -> tuple[int, int, int, int | None]:
        """Input indices of q, k, v and the mask (None without attn_mask) for ``count`` inputs."""
        mask = count - 1 if self.attn_mask else None
        data = count - 1 if self.attn_mask else count
        return 0, min(1, data - 1), data - 1, mask

    def dims(self, input_shapes: list[Shape]) -> tuple[int, int, int]:
        """(src, dst, mask heads) of these inputs: query rows, key / value rows, and the mask's
        channel count (num_heads for a per-head mask, 1 for a shared one, 0 without a mask);
        ShapeError when a shape does not fit the params."""
        qi, ki, vi, mi = self.roles(len(input_shapes))
        q, k, v = (tuple(input_shapes[i]) for i in (qi, ki, vi))
        for name, shape, width in (("q", q, self.qdim()), ("k", k, self.kdim), ("v", v, self.vdim)):
            if len(shape) not in (1, 2) or shape[-1] != width:
                raise ShapeError(f"MultiHeadAttention {name} {shape}: expected (seq, {width}) "
                                 f"or ({width},)")
        q, k, v = ((1, *s) if len(s) == 1 else s for s in (q, k, v))  # a 1-D blob is one row
        if k[0] != v[0]:
            raise ShapeError(f"MultiHeadAttention: k {k} and v {v} differ in length")
        src, dst = q[0], k[0]
        if mi is None:
            return src, dst, 0
        mask = tuple(input_shapes[mi])
        if mask == (src, dst):
            return src, dst, 1
        if mask == (self.num_heads, src, dst):
            return src, dst, self.num_heads
        raise ShapeError(f"MultiHeadAttention attn_mask {mask}: expected ({src}, {dst}) or "
                         f"({self.num_heads}, {src}, {dst})")

    def infer_shapes(self, input_shapes: list[Shape], num_outputs: int = 1) -> list[Shape]:
        src, _dst, _heads = self.dims(input_shapes)
        return [(src, self.qdim())]


@dataclasses.dataclass(frozen=True)
class PriorBoxParams(LayerParams):
    """SSD anchor boxes of a feature map (input 0; input 1, when present, is the image whose
    w/h stand in for image_width/height = -233). Two forms, chosen as ncnn chooses: mxnet's
    MultiBoxPrior (one input, image sizes both -233, no max_sizes) gives a 1-D output of
    boxes; the caffe form gives (2, n) rows of boxes and their variances. The values are
    ``vkserve.models.detection.prior_boxes``."""

    TYPE: ClassVar[str] = "PriorBox"
    INPUTS: ClassVar[tuple[int, int | None]] = (1, 2)
    min_sizes: tuple[float, ...] = p_floats(0)
    max_sizes: tuple[float, ...] = p_floats(1)
    aspect_ratios: tuple[float, ...] = p_floats(2)
    variance0: float = p_float(3, 0.1)
    variance1: float = p_float(4, 0.1)
    variance2: float = p_float(5, 0.2)
    variance3: float = p_float(6, 0.2)
    flip: int = p_int(7, 1)
    clip: int = p_int(8, 0)
    image_width: int = p_int(9, 0)
    image_height: int = p_int(10, 0)
    step_width: float = p_float(11, float(UNSET))
    step_height: float = p_float(12, float(UNSET))
    offset: float = p_float(13, 0.0)
    step_mmdetection: int = p_int(14, 0)
    center_mmdetection: int = p_int(15, 0)

    def validate(self) -> str | None:
        if not self.min_sizes:
            return "param 0 (min_sizes) must not be empty"
        if self.max_sizes and len(self.max_sizes) != len(self.min_sizes):
            return (f"param 1 (max_sizes): {len(self.max_sizes)} entries, expected none or one "
                    f"per min_size ({len(self.min_sizes)})")
        return None

    def mxnet_style(self, num_inputs: int) -> bool:
        return (num_inputs == 1 and self.image_width == UNSET and self.image_height == UNSET
                and not self.max_sizes)

    def priors_per_cell(self, mxnet: bool) -> int:
        n_min, n_ar = len(self.min_sizes), len(self.aspect_ratios)
        if mxnet:
            return n_min - 1 + n_ar
        return n_min * (1 + n_ar * (2 if self.flip else 1)) + len(self.max_sizes)

    def image_size(self, input_shapes: list[Shape]) -> tuple[int, int]:
        """(image_w, image_h) of the caffe form: the params, or input 1's w/h where -233."""
        sizes = []
        for pid, name, value, axis in ((9, "image_width", self.image_width, 0),
                                       (10, "image_height", self.image_height, 1)):
            if value == UNSET:
                if len(input_shapes) < 2:
                    raise ShapeError(f"param {pid} ({name}) is -233: needs the image as input 1")
                value = mat_whdc(input_shapes[1])[axis]
            if value == 0:
                raise ShapeError(f"param {pid} ({name}) is 0 (boxes are divided by it)")
            sizes.append(value)
        return sizes[0], sizes[1]

    def infer_shapes(self, input_shapes: list[Shape], num_outputs: int = 1) -> list[Shape]:
        w, h, _, _ = mat_whdc(input_shapes[0])
        mxnet = self.mxnet_style(len(input_shapes))
        if mxnet:
            if not self.aspect_ratios:
                raise ShapeError("param 2 (aspect_ratios): the mxnet form needs at least one")
            return [(4 * w * h * self.priors_per_cell(True),)]
        self.image_size(input_shapes)
        return [(2, 4 * w * h * self.priors_per_cell(False))]


@dataclasses.dataclass(frozen=True)
class DetectionOutputParams(LayerParams):
    """SSD post-processing of (location, confidence, priorbox): decode, per-class sort and NMS,
    global sort; rows of (label, score, xmin, ymin, xmax, ymax), data-dependent in number
    (``infer_shapes`` gives the upper bound). ``num_class = -233`` is mxnet's MultiBoxDetection
    layout. ncnn reads only the first three inputs; later ones are accepted and ignored.
    Computed by ``vkserve.models.detection.ssd_detect``. With no detection ncnn leaves its
    output an empty Mat; here it is (0, 6)."""

    TYPE: ClassVar[str] = "DetectionOutput"
    INPUTS: ClassVar[tuple[int, int | None]] = (3, 5)
    num_class: int = p_int(0, 0)
    nms_threshold: float = p_float(1, 0.05)
    nms_top_k: int = p_int(2, 300)
    keep_top_k: int = p_int(3, 100)
    confidence_threshold: float = p_float(4, 0.5)
    variance0: float = p_float(5, 0.1)
    variance1: float = p_float(6, 0.1)
    variance2: float = p_float(7, 0.2)
    variance3: float = p_float(8, 0.2)

    @property
    def mxnet_style(self) -> bool:
        return self.num_class == UNSET

    def validate(self) -> str | None:
        if self.num_class <= 0 and not self.mxnet_style:
            return f"param 0 (num_class): expected a positive count or -233, got {self.num_class}"
        if self.nms_top_k < 0:
            return f"param 2 (nms_top_k): expected >= 0, got {self.nms_top_k}"
        if self.keep_top_k < 0:
            return f"param 3 (keep_top_k): expected >= 0, got {self.keep_top_k}"
        return None

    def layout(self, input_shapes: list[Shape]) -> tuple[int, int]:
        """(num_prior, num_class) for these inputs; ShapeError when they do not fit."""
        loc, conf, prior = input_shapes[:3]
        for name, shape in (("location", loc), ("confidence", conf), ("priorbox", prior)):
            if len(shape) not in (1, 2):
                raise ShapeError(f"{self.TYPE}: {name} must be 1-D or 2-D, got {shape}")
        if self.mxnet_style:
            if len(prior) != 2 or prior[1] != 4 or len(conf) != 2:
                raise ShapeError(f"{self.TYPE} (mxnet form, num_class -233): expects priorbox "
                                 f"(num_prior, 4) and confidence (num_class, num_prior), got "
                                 f"{prior} and {conf}")
            num_prior, num_class = prior[0], conf[0]
        else:
            if len(prior) != 2 or prior[0] < 2:
                raise ShapeError(f"{self.TYPE}: priorbox must be 2-D with rows of boxes and "
                                 f"variances, got {prior}")
            num_prior, num_class = prior[1] // 4, self.num_class
        if volume(loc) != 4 * num_prior or volume(conf) != num_prior * num_class:
            raise ShapeError(f"{self.TYPE}: {num_prior} priors and {num_class} classes need "
                             f"{4 * num_prior} locations and {num_prior * num_class} "
                             f"confidences, got {loc} and {conf}")
        return num_prior, num_class

    def infer_shapes(self, input_shapes: list[Shape], num_outputs: int = 1) -> list[Shape]:
        num_prior, num_class = self.layout(input_shapes)
        per_class = min(self.nms_top_k, num_prior)
        return [(min(self.keep_top_k, max(num_class - 1, 0) * per_class), 6)]


@dataclasses.dataclass(frozen=True)
class YoloDetectionOutputParams(LayerParams):
    """YOLOv2 region output: decode every (c, h, w) input (num_box boxes of 5 + num_class
    channels; softmax over the classes), sort, class-agnostic NMS; rows of (label + 1,
    score, xmin, ymin, xmax, ymax), data-dependent in number (``infer_shapes`` gives the
    upper bound). Computed by ``vkserve.models.detection.yolo_v2_detect``. With no detection
    ncnn (an in-place layer) hands on input 0 with the softmax applied to its class channels;
    here the output is (0, 6) rows, as with any other count."""

    TYPE: ClassVar[str] = "YoloDetectionOutput"
    INPUTS: ClassVar[tuple[int, int | None]] = (1, None)
    num_class: int = p_int(0, 20)
    num_box: int = p_int(1, 5)
    confidence_threshold: float = p_float(2, 0.01)
    nms_threshold: float = p_float(3, 0.45)
    biases: tuple[float, ...] = p_floats(4)

    def validate(self) -> str | None:
        if self.num_class <= 0 or self.num_box <= 0:
            return "param 0 (num_class) and param 1 (num_box) must be positive"
        if len(self.biases) < 2 * self.num_box:
            return (f"param 4 (biases): {len(self.biases)} values, needs a (w, h) pair for each "
                    f"of the {self.num_box} boxes")
        return None

    def infer_shapes(self, input_shapes: list[Shape], num_outputs: int = 1) -> list[Shape]:
        candidates = 0
        for shape in input_shapes:
            _need_dims(self.TYPE, shape, (3,))
            c, h, w = shape
            if c // self.num_box != 5 + self.num_class:
                raise ShapeError(f"input {shape}: expected {self.num_box} x (5 + "
                                 f"{self.num_class}) channels")
            candidates += self.num_box * h * w
        return [(candidates, 6)]


UNARY_OPS = {0: "abs", 1: "neg", 2: "floor", 3: "ceil", 4: "square", 5: "sqrt", 6: "rsqrt",
             7: "exp", 8: "log", 9: "sin", 10: "cos", 11: "tan", 12: "asin", 13: "acos",
             14: "atan", 15: "reciprocal", 16: "tanh", 17: "log10", 18: "round", 19: "trunc",
             20: "sign", 21: "expm1", 22: "sinh", 23: "asinh", 24: "cosh", 25: "acosh",
             26: "atanh", 27: "log1p"}


@dataclasses.dataclass(frozen=True)
class UnaryOpParams(_SameShape):
    """y = op(x) elementwise (``UNARY_OPS``). round is half to even; sign(0) is 0. Outside an
    op's domain (sqrt / log of negatives, asin of |x| > 1 ...) ncnn's x86 kernels give NaN or
    approximation artefacts (acosh(x < 1) is -87.34): undefined here."""

    TYPE: ClassVar[str] = "UnaryOp"
    op_type: int = p_int(0)

    def validate(self) -> str | None:
        if self.op_type not in UNARY_OPS:
            return f"param 0 (op_type): unknown unary op {self.op_type} (ncnn has 0..27)"
        return None


@dataclasses.dataclass(frozen=True)
class ArgMaxParams(LayerParams):
    """The ``topk`` largest values of the whole input (read flat), largest first, a tie going
    to the larger index (ncnn's partial sort of (value, index) pairs): a (1, topk) blob of the
    indices (as floats), or with out_max_val (2, topk): the values, then the indices. ncnn
    reads a 3-D / 4-D blob with its channel padding (garbage, and counted in the indices, when
    a channel is not a multiple of 4 floats); here the blob is read dense."""

    TYPE: ClassVar[str] = "ArgMax"
    out_max_val: int = p_int(0)
    topk: int = p_int(1, 1)

    def validate(self) -> str | None:
        return f"param 1 (topk): must be positive, got {self.topk}" if self.topk <= 0 else None

    def infer_shapes(self, input_shapes: list[Shape], num_outputs: int = 1) -> list[Shape]:
        total = volume(input_shapes[0])
        if self.topk > total:
            raise ShapeError(f"ArgMax topk {self.topk} exceeds the input's {total} elements")
        return [(2 if self.out_max_val else 1, self.topk)]


# Cast element types (ncnn: 0 auto, 1 float32, 2 float16, 3 int8, 4 bfloat16)
CAST_TYPES = {1: "float32", 2: "float16", 3: "int8", 4: "bfloat16"}
# (type_from, type_to) pairs ncnn converts; it leaves the output unwritten for any other pair
_CAST_PAIRS = {(1, 2), (2, 1), (3, 1), (1, 4), (4, 1)}


@dataclasses.dataclass(frozen=True)
class CastParams(_SameShape):
    """Element type conversion. The engines hold every blob as float values, so a Cast is the
    value rounding it causes: to float16 RNE (overflow to inf), to bfloat16 RNE; from
    float16 / bfloat16 / int8 to float32 the value is kept. type_from == type_to passes the
    blob through. ncnn converts no other pair (its output is left unwritten): refused."""

    TYPE: ClassVar[str] = "Cast"
    type_from: int = p_int(0)
    type_to: int = p_int(1)

    def validate(self) -> str | None:
        if self.type_from == self.type_to or (self.type_from, self.type_to) in _CAST_PAIRS:
            return None
        names = [CAST_TYPES.get(t, "auto" if t == 0 else f"unknown type {t}")
                 for t in (self.type_from, self.type_to)]
        return (f"params 0 / 1 (type_from / type_to): ncnn does not cast {names[0]} to "
                f"{names[1]}")

    def rounding(self) -> str | None:
        """'float16' / 'bfloat16' when the cast rounds values to that type, else None."""
        if self.type_from == self.type_to:
            return None
        return {2: "float16", 4: "bfloat16"}.get(self.type_to)


def stat_channels(shape: Shape) -> int:
    """Channels MVN and Normalize keep statistics for: axis 0 of a 3-D / 4-D blob; a 1-D or
    2-D blob is one channel."""
    return shape[0] if len(shape) >= 3 else 1


@dataclasses.dataclass(frozen=True)
class NormalizeParams(_SameShape):
    """L2 normalisation: a = 1 / norm of the sum of squares ssum over each channel
    (across_spatial only), each spatial position's channel vector (across_channel only) or
    the whole blob (both); eps_mode 0 sqrt(ssum + eps), 1 max(sqrt(ssum), eps), 2
    sqrt(max(ssum, eps)); y = x * a * scale (scale_data[0] with channel_shared, else one per
    channel). Neither across_*: y = x."""

    TYPE: ClassVar[str] = "Normalize"
    across_spatial: int = p_int(0)
    channel_shared: int = p_int(1)
    eps: float = p_float(2, 0.0001)
    scale_data_size: int = p_int(3)
    across_channel: int = p_int(4, 1)
    eps_mode: int = p_int(9)

    def validate(self) -> str | None:
        if self.eps_mode not in (0, 1, 2):
            return f"param 9 (eps_mode): expected 0, 1 or 2, got {self.eps_mode}"
        if self.scale_data_size <= 0:
            return f"param 3 (scale_data_size): must be positive, got {self.scale_data_size}"
        return None

    def weight_specs(self) -> list[WeightSpec]:
        return [WeightSpec("scale_data", self.scale_data_size, False)]

    def infer_shapes(self, input_shapes: list[Shape], num_outputs: int = 1) -> list[Shape]:
        shape = tuple(input_shapes[0])
        need = 1 if self.channel_shared else stat_channels(shape)
        if self.scale_data_size < need:
            raise ShapeError(f"Normalize: scale_data_size {self.scale_data_size} < {need} "
                             f"channels of the input {shape}")
        return [shape]


@dataclasses.dataclass(frozen=True)
class MVNParams(LayerParams):
    """y = x - mean, then with normalize_variance y / (sqrt(mean(y^2)) + eps); the statistics
    per channel (``stat_channels``) or over the whole blob (across_channels). The output is
    3-D for a 1-D / 2-D input ((1, 1, w) / (1, h, w)), as ncnn creates it."""

    TYPE: ClassVar[str] = "MVN"
    normalize_variance: int = p_int(0)
    across_channels: int = p_int(1)
    eps: float = p_float(2, 0.0001)

    def infer_shapes(self, input_shapes: list[Shape], num_outputs: int = 1) -> list[Shape]:
        shape = tuple(input_shapes[0])
        return [shape if len(shape) >= 3 else (1,) * (3 - len(shape)) + shape]


@dataclasses.dataclass(frozen=True)
class EmbedParams(LayerParams):
    """out[i] = weight[index_i] (+ bias) for the first w input elements (w = the input's last
    axis, ncnn's words): a (w, num_output) blob. ncnn reads each element's 32 bits as an int
    token id; the engines hold floats, so here an element's value is the id (truncated toward
    zero), clamped to [0, input_dim - 1] as ncnn clamps."""

    TYPE: ClassVar[str] = "Embed"
    UNSUPPORTED: ClassVar[dict[int, str]] = {18: "int8_scale_term (int8 quantized Embed)"}
    num_output: int = p_int(0)
    input_dim: int = p_int(1)
    bias_term: int = p_int(2)
    weight_data_size: int = p_int(3)

    def validate(self) -> str | None:
        if self.num_output <= 0 or self.input_dim <= 0:
            return (f"params 0 / 1 (num_output / input_dim): must be positive, got "
                    f"{self.num_output} / {self.input_dim}")
        if self.weight_data_size != self.num_output * self.input_dim:
            return (f"param 3 (weight_data_size): {self.weight_data_size} is not num_output "
                    f"{self.num_output} x input_dim {self.input_dim}")
        return None

    def weight_specs(self) -> list[WeightSpec]:
        specs = [WeightSpec("weight_data", self.weight_data_size, True)]
        if self.bias_term:
            specs.append(WeightSpec("bias_data", self.num_output, False))
        return specs

    def infer_shapes(self, input_shapes: list[Shape], num_outputs: int = 1) -> list[Shape]:
        return [(input_shapes[0][-1], self.num_output)]


LAYER_TYPES: dict[str, type[LayerParams]] = {
    cls.TYPE: cls
    for cls in (
        InputParams, ConvolutionParams, ConvolutionDepthWiseParams, PoolingParams,
        DeconvolutionParams, DeconvolutionDepthWiseParams,
        InnerProductParams, SoftmaxParams, SplitParams, ConcatParams, SliceParams,
        EltwiseParams, BinaryOpParams, ReLUParams, ClipParams, SigmoidParams, SwishParams,
        HardSigmoidParams, HardSwishParams, DropoutParams, NoopParams, FlattenParams,
        ShuffleChannelParams, LRNParams, ReshapeParams, PermuteParams, CropParams, InterpParams,
        SqueezeParams, ExpandDimsParams, MemoryDataParams,
        PaddingParams, Yolov3DetectionOutputParams,
        PriorBoxParams, DetectionOutputParams, YoloDetectionOutputParams,
        BatchNormParams, ScaleParams, BiasParams, LayerNormParams, RMSNormParams,
        GroupNormParams, InstanceNormParams,
        GemmParams, MatMulParams,
        TanHParams, AbsValParams, ELUParams, SELUParams, MishParams, SoftplusParams, GELUParams,
        ExpParams, LogParams, PowerParams, ErfParams, ThresholdParams, PReLUParams,
        ReductionParams, PixelShuffleParams, ReorgParams, GLUParams, TileParams,
        UnaryOpParams, ArgMaxParams, CastParams, NormalizeParams, MVNParams, EmbedParams,
        MultiHeadAttentionParams,
    )
}
