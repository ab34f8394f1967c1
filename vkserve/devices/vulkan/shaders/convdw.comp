#version 450
// Depthwise convolution (group == channels == num_output) with ncnn's fused activation.
// One invocation computes one output element: gl_GlobalInvocationID = (out x, out y, channel).
//
// weight: sfp [channel][kernel_h * kernel_w] (ncnn's order), bias: sfp [channel] (zeros
// without bias). Sums are float in every mode. With out_hwc = 1 the output is stored
// channels-last ([out y][out x][channel]: a following Permute folded in, engine.fusion).

layout (constant_id = 0) const int w = 0;
layout (constant_id = 1) const int h = 0;
layout (constant_id = 2) const int outw = 0;
layout (constant_id = 3) const int outh = 0;
layout (constant_id = 4) const int c = 0;
layout (constant_id = 5) const int kernel_w = 0;
layout (constant_id = 6) const int kernel_h = 0;
layout (constant_id = 7) const int dilation_w = 0;
layout (constant_id = 8) const int dilation_h = 0;
layout (constant_id = 9) const int stride_w = 0;
layout (constant_id = 10) const int stride_h = 0;
layout (constant_id = 11) const int pad_left = 0;
layout (constant_id = 12) const int pad_top = 0;
layout (constant_id = 13) const float pad_value = 0;
layout (constant_id = 14) const int activation_type = 0;
layout (constant_id = 15) const float activation_param_0 = 0;
layout (constant_id = 16) const float activation_param_1 = 0;
layout (constant_id = 17) const int out_hwc = 0;

layout (binding = 0) readonly buffer bottom_blob { sfp bottom_blob_data[]; };
layout (binding = 1) buffer top_blob { sfp top_blob_data[]; };
layout (binding = 2) readonly buffer weight_blob { sfp weight_data[]; };
layout (binding = 3) readonly buffer bias_blob { sfp bias_data[]; };

layout (push_constant) uniform parameter
{
    int w;
    int h;
    int outw;
    int outh;
    int c;
    int kernel_w;
    int kernel_h;
    int dilation_w;
    int dilation_h;
    int stride_w;
    int stride_h;
    int pad_left;
    int pad_top;
    float pad_value;
} p;

#include "activate.h"

void main()
{
    const int gx = int(gl_GlobalInvocationID.x);
    const int gy = int(gl_GlobalInvocationID.y);
    const int gz = int(gl_GlobalInvocationID.z);
    const int W = psc(w);
    const int H = psc(h);
    const int OUTW = psc(outw);
    const int OUTH = psc(outh);
    if (gx >= OUTW || gy >= OUTH || gz >= psc(c))
        return;

    const int KW = psc(kernel_w);
    const int KH = psc(kernel_h);
    const int DW = psc(dilation_w);
    const int DH = psc(dilation_h);
    const int x0 = gx * psc(stride_w) - psc(pad_left);
    const int y0 = gy * psc(stride_h) - psc(pad_top);
    const float padv = psc(pad_value);

    float sum = float(buffer_ld1(bias_data, gz));
    int wi = gz * KH * KW;
    const int ci = gz * H * W;
    for (int ky = 0; ky < KH; ky++)
    {
        const int iy = y0 + ky * DH;
        const bool yin = uint(iy) < uint(H);
        const int row = ci + iy * W;
        for (int kx = 0; kx < KW; kx++)
        {
            const int ix = x0 + kx * DW;
            float v = padv;
            if (yin && uint(ix) < uint(W))
                v = float(buffer_ld1(bottom_blob_data, row + ix));
            sum += v * float(buffer_ld1(weight_data, wi));
            wi++;
        }
    }

    const int at = out_hwc == 1 ? (gy * OUTW + gx) * psc(c) + gz : (gz * OUTH + gy) * OUTW + gx;
    buffer_st1(top_blob_data, at, activate(sum));
}
