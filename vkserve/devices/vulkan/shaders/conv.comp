#version 450
// General (grouped, strided, dilated, padded) convolution with ncnn's fused activation.
// One invocation computes 4 output channels of one group at one output pixel:
// gl_GlobalInvocationID = (out x, out y, group * tiles + tile). Every input value is read once
// per invocation and multiplied into 4 accumulators with one vec4 weight load.
//
// weight: sfpvec4 [group][tile][icg][kernel_h * kernel_w] (4 output channels of the tile;
//         channels past ocg are zero), bias: sfpvec4 [group][tile] (zeros without bias).
// Sums are float in every mode: a reduction over icg * k * k terms loses too much in fp16.

layout (constant_id = 0) const int w = 0;
layout (constant_id = 1) const int h = 0;
layout (constant_id = 2) const int outw = 0;
layout (constant_id = 3) const int outh = 0;
layout (constant_id = 4) const int icg = 0;        // input channels per group
layout (constant_id = 5) const int ocg = 0;        // output channels per group
layout (constant_id = 6) const int tiles = 0;      // ceil(ocg / 4)
layout (constant_id = 7) const int groups = 0;
layout (constant_id = 8) const int kernel_w = 0;
layout (constant_id = 9) const int kernel_h = 0;
layout (constant_id = 10) const int dilation_w = 0;
layout (constant_id = 11) const int dilation_h = 0;
layout (constant_id = 12) const int stride_w = 0;
layout (constant_id = 13) const int stride_h = 0;
layout (constant_id = 14) const int pad_left = 0;
layout (constant_id = 15) const int pad_top = 0;
layout (constant_id = 16) const float pad_value = 0;
layout (constant_id = 17) const int activation_type = 0;
layout (constant_id = 18) const float activation_param_0 = 0;
layout (constant_id = 19) const float activation_param_1 = 0;

layout (binding = 0) readonly buffer bottom_blob { sfp bottom_blob_data[]; };
layout (binding = 1) buffer top_blob { sfp top_blob_data[]; };
layout (binding = 2) readonly buffer weight_blob { sfpvec4 weight_data[]; };
layout (binding = 3) readonly buffer bias_blob { sfpvec4 bias_data[]; };

layout (push_constant) uniform parameter
{
    int w;
    int h;
    int outw;
    int outh;
    int icg;
    int ocg;
    int tiles;
    int groups;
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
    const int TILES = psc(tiles);
    if (gx >= psc(outw) || gy >= psc(outh) || gz >= TILES * psc(groups))
        return;

    const int ICG = psc(icg);
    const int KW = psc(kernel_w);
    const int KH = psc(kernel_h);
    const int DW = psc(dilation_w);
    const int DH = psc(dilation_h);
    const int g = gz / TILES;
    const int oc0 = g * psc(ocg) + (gz - g * TILES) * 4;

    vec4 sum = vec4(buffer_ld4(bias_data, gz));
    const int x0 = gx * psc(stride_w) - psc(pad_left);
    const int y0 = gy * psc(stride_h) - psc(pad_top);
    const float padv = psc(pad_value);
    int wi = gz * ICG * KH * KW;
    int ci = g * ICG * H * W;
    for (int ic = 0; ic < ICG; ic++)
    {
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
                sum += v * vec4(buffer_ld4(weight_data, wi));
                wi++;
            }
        }
        ci += H * W;
    }

    const int ocg_ = psc(ocg);
    const int plane = psc(outw) * psc(outh);
    const int gi = oc0 * plane + gy * psc(outw) + gx;
    const int left = ocg_ - (oc0 - g * ocg_);  // channels of this tile inside the group
    for (int k = 0; k < 4; k++)
    {
        if (k < left)
        {
            buffer_st1(top_blob_data, gi + k * plane, activate(sum[k]));
        }
    }
}
