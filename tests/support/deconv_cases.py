"""Deconvolution / DeconvolutionDepthWise cases shared by the CPU and Vulkan tests against ncnn."""

from __future__ import annotations

from typing import NamedTuple


class Case(NamedTuple):
    type: str
    shape: tuple[int, int, int]
    num_output: int
    kernel: tuple[int, int]  # (h, w)
    extra: str = ""  # further params: stride, dilation, pads, output_pad, output_w/h, activation
    group: int = 1
    bias: int = 1

    @property
    def id(self) -> str:
        return f"{self.type}-{self.shape}-o{self.num_output}-k{self.kernel}-g{self.group}-b{self.bias}-{self.extra}"


def deconv_line(case: Case) -> str:
    kh, kw = case.kernel
    c = case.shape[0]
    size = case.num_output // case.group * (c // case.group) * kh * kw * case.group
    group = f" 7={case.group}" if case.type == "DeconvolutionDepthWise" else ""
    return (f"{case.type} op 1 1 data out 0={case.num_output} 1={kw} 11={kh} 5={case.bias} "
            f"6={size}{group} {case.extra}").rstrip()


D, DW = "Deconvolution", "DeconvolutionDepthWise"

CASES = [
    Case(D, (3, 5, 6), 4, (3, 3)),
    Case(D, (3, 5, 6), 4, (3, 3), bias=0),
    Case(D, (4, 5, 7), 5, (3, 3), "3=2"),
    Case(D, (4, 5, 7), 5, (4, 4), "3=2 4=1"),
    Case(D, (2, 4, 5), 3, (3, 2), "3=3 13=2"),
    Case(D, (3, 5, 6), 6, (3, 3), "2=2 3=2"),
    Case(D, (3, 5, 6), 6, (3, 3), "2=1 12=2 3=1 13=3"),
    Case(D, (3, 6, 5), 4, (3, 3), "3=2 4=1 15=0 14=2 16=1"),
    Case(D, (3, 6, 5), 4, (3, 3), "3=2 4=1 18=1"),
    Case(D, (3, 6, 5), 4, (4, 3), "3=3 13=2 18=2 19=1"),
    Case(D, (3, 5, 6), 4, (3, 3), "3=2 4=-233 20=12 21=10"),
    Case(D, (3, 5, 6), 4, (3, 3), "3=2 4=-234 20=11 21=9"),
    Case(D, (3, 5, 6), 4, (4, 4), "3=2 4=-233 15=-233 14=-233 16=-233 20=9 21=8"),
    Case(D, (17, 4, 5), 9, (2, 2), "3=2"),
    Case(D, (3, 5, 6), 4, (3, 3), "3=2 9=1"),
    Case(D, (3, 5, 6), 4, (3, 3), "9=2 -23310=1,1.000000e-01"),
    Case(D, (3, 5, 6), 4, (3, 3), "9=3 -23310=2,-5.000000e-01,5.000000e-01"),
    Case(D, (3, 5, 6), 4, (3, 3), "9=4"),
    Case(D, (3, 5, 6), 4, (3, 3), "9=5"),
    Case(D, (3, 5, 6), 4, (3, 3), "9=6 -23310=2,2.000000e-01,5.000000e-01"),
    Case(DW, (4, 5, 6), 4, (3, 3), group=4),
    Case(DW, (4, 5, 6), 4, (3, 3), "3=2 4=1", group=4, bias=0),
    Case(DW, (6, 5, 6), 6, (3, 3), "2=2 3=2 14=1 18=1", group=6),
    Case(DW, (6, 5, 6), 4, (3, 3), "3=2", group=2),
    Case(DW, (6, 5, 6), 9, (2, 3), "3=2 13=3 4=1 15=2", group=3),
    Case(DW, (4, 5, 6), 8, (3, 3), "3=2 9=1", group=4),
    Case(DW, (4, 5, 6), 4, (3, 3), "3=2 4=-233 20=11 21=10 9=2 -23310=1,2.000000e-01", group=4),
    Case(DW, (8, 4, 5), 8, (3, 3), "3=2 9=4", group=2),
    Case(DW, (4, 5, 6), 4, (3, 3), "9=5", group=1),
    Case(D, (5, 7, 6), 3, (3, 4), "2=2 12=1 3=3 13=2 4=2 15=1 14=0 16=3 18=2 19=1"),
    Case(DW, (5, 6, 7), 5, (3, 3), "2=2 3=3 4=-234 20=19 21=16 9=3 -23310=2,-1.0,1.0", group=5),
    Case(D, (40, 6, 5), 70, (3, 3), "3=2 4=1 18=1"),
    Case(DW, (12, 5, 4), 18, (2, 2), "3=2 2=2", group=3, bias=0),
]

BAD_CASES = [
    Case(D, (3, 5, 6), 4, (3, 3), "20=10 21=10"),          # output_w without a SAME pad
    Case(D, (3, 5, 6), 4, (3, 3), "4=1 15=-1"),            # positive and negative pads
    Case(D, (3, 2, 2), 4, (1, 1), "4=1"),                   # nothing left after the cut
    Case(DW, (6, 5, 6), 4, (3, 3), group=4),                # group does not divide channels
    Case(D, (3, 5, 6), 4, (3, 3), "4=-233 20=10 21=10"),   # output_w / h beyond the full output
    Case(D, (3, 5, 6), 4, (3, 3), "18=-1"),                # negative output_pad
]
