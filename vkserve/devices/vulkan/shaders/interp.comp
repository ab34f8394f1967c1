#version 450
// Interp (c, h, w) -> (c, outh, outw), nearest or bilinear, as ncnn's CPU Interp:
// nearest: source min(int(x * scale_w), w - 1) (float32 product, truncated);
// bilinear: source coordinate x * scale_w (align_corner) or (x + 0.5) * scale_w - 0.5, split
// into floor and fraction; left of the input clamps to (0, fraction 0), right of it to
// (w - 2, fraction 1). One output element per invocation: (out x, out y, channel).

layout (constant_id = 0) const int w = 0;
layout (constant_id = 1) const int h = 0;
layout (constant_id = 2) const int outw = 0;
layout (constant_id = 3) const int outh = 0;
layout (constant_id = 4) const int c = 0;
layout (constant_id = 5) const float scale_w = 0;
layout (constant_id = 6) const float scale_h = 0;
layout (constant_id = 7) const int resize_type = 0;  // 1 nearest, 2 bilinear
layout (constant_id = 8) const int align_corner = 0;

layout (binding = 0) readonly buffer bottom_blob { sfp bottom_blob_data[]; };
layout (binding = 1) buffer top_blob { sfp top_blob_data[]; };

layout (push_constant) uniform parameter
{
    int w;
    int h;
    int outw;
    int outh;
    int c;
    float scale_w;
    float scale_h;
} p;

// first tap, the second tap and the weight of the second (ncnn's linear_coeffs)
void taps(int o, float scale, int n, out int i0, out int i1, out float a)
{
    const float f = align_corner != 0 ? float(o) * scale : (float(o) + 0.5) * scale - 0.5;
    int i = int(floor(f));
    a = f - float(i);
    if (i < 0)
    {
        i = 0;
        a = 0.0;
    }
    if (i >= n - 1)
    {
        i = n - 2;
        a = 1.0;
    }
    i0 = max(i, 0);  // n == 1: both taps are element 0
    i1 = min(i + 1, n - 1);
}

void main()
{
    const int gx = int(gl_GlobalInvocationID.x);
    const int gy = int(gl_GlobalInvocationID.y);
    const int gz = int(gl_GlobalInvocationID.z);
    const int OUTW = psc(outw);
    const int OUTH = psc(outh);
    if (gx >= OUTW || gy >= OUTH || gz >= psc(c))
        return;

    const int W = psc(w);
    const int H = psc(h);
    const int ci = gz * H * W;
    const int gi = (gz * OUTH + gy) * OUTW + gx;
    if (resize_type == 1)
    {
        const int sx = min(int(float(gx) * psc(scale_w)), W - 1);
        const int sy = min(int(float(gy) * psc(scale_h)), H - 1);
        buffer_cp1(top_blob_data, gi, bottom_blob_data, ci + sy * W + sx);
        return;
    }

    int x0, x1, y0, y1;
    float ax, ay;
    taps(gx, psc(scale_w), W, x0, x1, ax);
    taps(gy, psc(scale_h), H, y0, y1, ay);
    const int r0 = ci + y0 * W;
    const int r1 = ci + y1 * W;
    const float top = mix(float(buffer_ld1(bottom_blob_data, r0 + x0)), float(buffer_ld1(bottom_blob_data, r0 + x1)), ax);
    const float bottom = mix(float(buffer_ld1(bottom_blob_data, r1 + x0)), float(buffer_ld1(bottom_blob_data, r1 + x1)), ax);
    buffer_st1(top_blob_data, gi, mix(top, bottom, ay));
}
