#version 450
// Deconvolution / DeconvolutionDepthWise (any group) with ncnn's fused activation.
// One invocation computes one output element by gathering over the kernel taps:
// gl_GlobalInvocationID = (out x, out y, output channel). Output (y, x) is (Y, X) = (y + cut_top,
// x + cut_left) of the full output, which input (iy, ix) reaches through tap (ky, kx) when
// iy * stride_h + ky * dilation_h == Y (likewise x).
//
// weight: sfp [num_output][channels / group][kernel_h * kernel_w] (ncnn's order, not flipped),
// bias: sfp [num_output] (zeros without bias). Sums are float in every mode.

layout (constant_id = 0) const int w = 0;
layout (constant_id = 1) const int h = 0;
layout (constant_id = 2) const int outw = 0;
layout (constant_id = 3) const int outh = 0;
layout (constant_id = 4) const int icg = 0;
layout (constant_id = 5) const int ocg = 0;
layout (constant_id = 6) const int outc = 0;
layout (constant_id = 7) const int kernel_w = 0;
layout (constant_id = 8) const int kernel_h = 0;
layout (constant_id = 9) const int dilation_w = 0;
layout (constant_id = 10) const int dilation_h = 0;
layout (constant_id = 11) const int stride_w = 0;
layout (constant_id = 12) const int stride_h = 0;
layout (constant_id = 13) const int cut_left = 0;
layout (constant_id = 14) const int cut_top = 0;
layout (constant_id = 15) const int activation_type = 0;
layout (constant_id = 16) const float activation_param_0 = 0;
layout (constant_id = 17) const float activation_param_1 = 0;

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
    int icg;
    int ocg;
    int outc;
    int kernel_w;
    int kernel_h;
    int dilation_w;
    int dilation_h;
    int stride_w;
    int stride_h;
    int cut_left;
    int cut_top;
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
    if (gx >= OUTW || gy >= OUTH || gz >= psc(outc))
        return;

    const int ICG = psc(icg);
    const int KW = psc(kernel_w);
    const int KH = psc(kernel_h);
    const int DW = psc(dilation_w);
    const int DH = psc(dilation_h);
    const int SW = psc(stride_w);
    const int SH = psc(stride_h);
    const int X = gx + psc(cut_left);
    const int Y = gy + psc(cut_top);
    const int maxk = KW * KH;
    const int c0 = (gz / psc(ocg)) * ICG;  // the group's first input channel

    float sum = float(buffer_ld1(bias_data, gz));
    for (int ky = 0; ky < KH; ky++)
    {
        const int sy = Y - ky * DH;
        if (sy < 0 || sy % SH != 0)
            continue;
        const int iy = sy / SH;
        if (iy >= H)
            continue;
        for (int kx = 0; kx < KW; kx++)
        {
            const int sx = X - kx * DW;
            if (sx < 0 || sx % SW != 0)
                continue;
            const int ix = sx / SW;
            if (ix >= W)
                continue;
            int wi = gz * ICG * maxk + ky * KW + kx;
            int bi = (c0 * H + iy) * W + ix;
            for (int q = 0; q < ICG; q++)
            {
                sum += float(buffer_ld1(bottom_blob_data, bi)) * float(buffer_ld1(weight_data, wi));
                wi += maxk;
                bi += H * W;
            }
        }
    }

    buffer_st1(top_blob_data, (gz * OUTH + gy) * OUTW + gx, activate(sum));
}
