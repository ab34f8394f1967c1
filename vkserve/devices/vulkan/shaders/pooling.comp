#version 450
// Max / average pooling over a kernel_w x kernel_h window; one output element per invocation:
// gl_GlobalInvocationID = (out x, out y, channel). Window origin in padded coordinates is
// (x * stride_w, y * stride_h); the input occupies [pad_left, pad_left + w) x [pad_top, pad_top + h)
// there. Padding cells are skipped: -FLT_MAX never wins a max (a window of padding only gives
// -FLT_MAX, as ncnn) and 0 adds nothing to a sum.
// Average divisor (ncnn): kernel_w * kernel_h with avgpool_count_include_pad, otherwise the
// number of window cells inside the count region [count_x0, count_x1) x [count_y0, count_y1)
// (the padded input less the declared pads and the full-mode tail), computed, not counted.
// adaptive = 1: ncnn's adaptive windows instead, rows [h * y / outh, ceil(h * (y + 1) / outh))
// and likewise columns, averaged over their size; kernel, stride and pads are unused.
// Compiled with NCNN_image_shader (the image_storage option bit) the input is a 3D image
// (x, y, channel: a sampler, texelFetch through image3d_ld1) instead of a buffer; the output
// stays a buffer (VulkanPooling.use_image; the Plan copies the input blob into the image).

layout (constant_id = 0) const int w = 0;
layout (constant_id = 1) const int h = 0;
layout (constant_id = 2) const int outw = 0;
layout (constant_id = 3) const int outh = 0;
layout (constant_id = 4) const int c = 0;
layout (constant_id = 5) const int kernel_w = 0;
layout (constant_id = 6) const int kernel_h = 0;
layout (constant_id = 7) const int stride_w = 0;
layout (constant_id = 8) const int stride_h = 0;
layout (constant_id = 9) const int pad_left = 0;
layout (constant_id = 10) const int pad_top = 0;
layout (constant_id = 11) const int count_x0 = 0;
layout (constant_id = 12) const int count_x1 = 0;
layout (constant_id = 13) const int count_y0 = 0;
layout (constant_id = 14) const int count_y1 = 0;
layout (constant_id = 15) const int pooling_type = 0;  // 0 max, 1 average
layout (constant_id = 16) const int count_include_pad = 0;
layout (constant_id = 17) const int adaptive = 0;

#if NCNN_image_shader
layout (binding = 0) uniform unfp sampler3D bottom_blob;
#else
layout (binding = 0) readonly buffer bottom_blob { sfp bottom_blob_data[]; };
#endif
layout (binding = 1) buffer top_blob { sfp top_blob_data[]; };

layout (push_constant) uniform parameter
{
    int w;
    int h;
    int outw;
    int outh;
    int c;
    int kernel_w;
    int kernel_h;
    int stride_w;
    int stride_h;
    int pad_left;
    int pad_top;
    int count_x0;
    int count_x1;
    int count_y0;
    int count_y1;
} p;

// input value (x, y) of channel ch
float bottom_at(int x, int y, int ch)
{
#if NCNN_image_shader
    return float(image3d_ld1(bottom_blob, ivec3(x, y, ch)));
#else
    return float(buffer_ld1(bottom_blob_data, (ch * psc(h) + y) * psc(w) + x));
#endif
}

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

    int KW = psc(kernel_w);
    int KH = psc(kernel_h);
    int px0 = gx * psc(stride_w);  // window origin, padded coordinates
    int py0 = gy * psc(stride_h);
    int x0 = px0 - psc(pad_left);  // window origin, input coordinates
    int y0 = py0 - psc(pad_top);
    if (adaptive != 0)
    {
        x0 = (W * gx) / OUTW;
        y0 = (H * gy) / OUTH;
        KW = (W * (gx + 1) + OUTW - 1) / OUTW - x0;
        KH = (H * (gy + 1) + OUTH - 1) / OUTH - y0;
    }
    // the window part inside the input (the loops touch no padding)
    const int kx0 = max(0, -x0);
    const int kx1 = min(KW, W - x0);
    const int ky0 = max(0, -y0);
    const int ky1 = min(KH, H - y0);

    float res;
    if (pooling_type == 0)
    {
        res = -3.402823466e+38;
        for (int ky = ky0; ky < ky1; ky++)
        {
            for (int kx = kx0; kx < kx1; kx++)
                res = max(res, bottom_at(x0 + kx, y0 + ky, gz));
        }
    }
    else
    {
        float sum = 0.0;
        for (int ky = ky0; ky < ky1; ky++)
        {
            for (int kx = kx0; kx < kx1; kx++)
                sum += bottom_at(x0 + kx, y0 + ky, gz);
        }
        int area = KW * KH;
        if (count_include_pad == 0 && adaptive == 0)
        {
            const int nx = min(px0 + KW, psc(count_x1)) - max(px0, psc(count_x0));
            const int ny = min(py0 + KH, psc(count_y1)) - max(py0, psc(count_y0));
            area = max(nx, 0) * max(ny, 0);
        }
        res = sum / float(area);
    }

    buffer_st1(top_blob_data, (gz * OUTH + gy) * OUTW + gx, res);
}
