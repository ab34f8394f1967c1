#version 450
#extension GL_EXT_control_flow_attributes : require
// Depthwise convolution (group == channels == num_output) with ncnn's fused activation.
// One invocation computes outs_x neighbouring outputs of one row of one channel:
// gl_GlobalInvocationID = (block x, out y, channel). Each input row is read once into registers
// and feeds every output of the block whose taps reach it; where a row's inputs do not fit the
// registers (long or widely dilated kernels) each tap reads its own. Sums run over ky, then kx.
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
layout (constant_id = 18) const int outs_x = 1;

// outs_x <= MAX_OUTS; a row's inputs, (outs_x - 1) * stride_w + (kernel_w - 1) * dilation_w + 1,
// are kept in registers where they fit in MAX_SPAN (vulkan.layers.conv.depthwise_outputs)
#define MAX_OUTS 4
#define MAX_SPAN 16

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

float input_at(int row, bool yin, int ix, int W, float padv)
{
    return yin && uint(ix) < uint(W) ? float(buffer_ld1(bottom_blob_data, row + ix)) : padv;
}

void main()
{
    const int bx = int(gl_GlobalInvocationID.x) * outs_x;
    const int gy = int(gl_GlobalInvocationID.y);
    const int gz = int(gl_GlobalInvocationID.z);
    const int W = psc(w);
    const int H = psc(h);
    const int OUTW = psc(outw);
    const int OUTH = psc(outh);
    if (bx >= OUTW || gy >= OUTH || gz >= psc(c))
        return;

    const int KW = psc(kernel_w);
    const int KH = psc(kernel_h);
    const int DW = psc(dilation_w);
    const int SW = psc(stride_w);
    const int x0 = bx * SW - psc(pad_left);
    const int y0 = gy * psc(stride_h) - psc(pad_top);
    const float padv = psc(pad_value);
    const int span = (outs_x - 1) * SW + (KW - 1) * DW + 1;

    const float bias = float(buffer_ld1(bias_data, gz));
    float sum[MAX_OUTS];
    [[unroll]] for (int ox = 0; ox < outs_x; ox++)
        sum[ox] = bias;

    int wi = gz * KH * KW;
    const int ci = gz * H * W;
    for (int ky = 0; ky < KH; ky++)
    {
        const int iy = y0 + ky * psc(dilation_h);
        const bool yin = uint(iy) < uint(H);
        const int row = ci + iy * W;
        float v[MAX_SPAN];
        [[unroll]] for (int t = 0; t < min(span, MAX_SPAN); t++)
            v[t] = input_at(row, yin, x0 + t, W, padv);
        [[unroll]] for (int kx = 0; kx < KW; kx++)
        {
            const float k = float(buffer_ld1(weight_data, wi + kx));
            [[unroll]] for (int ox = 0; ox < outs_x; ox++)
            {
                const int t = ox * SW + kx * DW;
                sum[ox] += (span <= MAX_SPAN ? v[min(t, MAX_SPAN - 1)] : input_at(row, yin, x0 + t, W, padv)) * k;
            }
        }
        wi += KW;
    }

    [[unroll]] for (int ox = 0; ox < outs_x; ox++)
    {
        const int gx = bx + ox;
        if (gx < OUTW)
        {
            const int at = out_hwc == 1 ? (gy * OUTW + gx) * psc(c) + gz : (gz * OUTH + gy) * OUTW + gx;
            buffer_st1(top_blob_data, at, activate(sum[ox]));
        }
    }
}
