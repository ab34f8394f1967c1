#version 450
// Interp (c, h, w) -> (c, outh, outw), nearest, bilinear or bicubic, as ncnn's CPU Interp.
// Each output pixel is a weighted sum of taps along w, then along h (taps()):
// nearest: source min(int(x * scale_w), w - 1) (float32 product, truncated);
// bilinear / bicubic: source coordinate x * scale_w (align_corner) or (x + 0.5) * scale_w - 0.5,
// split into floor and fraction; bilinear clamps left of the input to (0, fraction 0) and
// right of it to (w - 2, fraction 1); bicubic (A = -0.75) folds the weights of taps outside
// the input inwards by ncnn's four border checks, applied in turn.
// resize_h = 0 keeps rows (a 2-D blob is resized along w only: outh = h).
// One output element per invocation: (out x, out y, channel).

layout (constant_id = 0) const int w = 0;
layout (constant_id = 1) const int h = 0;
layout (constant_id = 2) const int outw = 0;
layout (constant_id = 3) const int outh = 0;
layout (constant_id = 4) const int c = 0;
layout (constant_id = 5) const float scale_w = 0;
layout (constant_id = 6) const float scale_h = 0;
layout (constant_id = 7) const int resize_type = 0;  // 1 nearest, 2 bilinear, 3 bicubic
layout (constant_id = 8) const int align_corner = 0;
layout (constant_id = 9) const int resize_h = 1;

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

// Taps of output position o along an axis of n input pixels: count, indices (clamped into
// the input; a tap outside has weight 0) and weights. kind 0 keeps the position.
int taps(int o, float scale, int n, int kind, out int idx[4], out float wt[4])
{
    if (kind == 0)
    {
        idx[0] = o;
        wt[0] = 1.0;
        return 1;
    }
    if (kind == 1)
    {
        idx[0] = min(int(float(o) * scale), n - 1);
        wt[0] = 1.0;
        return 1;
    }
    const float f = align_corner != 0 ? float(o) * scale : (float(o) + 0.5) * scale - 0.5;
    int s = int(floor(f));
    const float a = f - float(s);
    if (kind == 2)
    {
        float b = a;
        if (s < 0)
        {
            s = 0;
            b = 0.0;
        }
        if (s >= n - 1)
        {
            s = n - 2;
            b = 1.0;
        }
        idx[0] = max(s, 0);  // n == 1: both taps are element 0
        idx[1] = min(s + 1, n - 1);
        wt[0] = 1.0 - b;
        wt[1] = b;
        return 2;
    }
    const float A = -0.75;
    const float f0 = a + 1.0;
    const float f2 = 1.0 - a;
    vec4 k;
    k.x = A * f0 * f0 * f0 - 5.0 * A * f0 * f0 + 8.0 * A * f0 - 4.0 * A;
    k.y = (A + 2.0) * a * a * a - (A + 3.0) * a * a + 1.0;
    k.z = (A + 2.0) * f2 * f2 * f2 - (A + 3.0) * f2 * f2 + 1.0;
    k.w = 1.0 - k.x - k.y - k.z;
    if (s <= -1)
    {
        s = 1;
        k = vec4(1.0 - k.w, k.w, 0.0, 0.0);
    }
    if (s == 0)
    {
        s = 1;
        k = vec4(k.x + k.y, k.z, k.w, 0.0);
    }
    if (s == n - 2)
    {
        s = n - 3;
        k = vec4(0.0, k.x, k.y, k.z + k.w);
    }
    if (s >= n - 1)
    {
        s = n - 3;
        k = vec4(0.0, 0.0, k.x, 1.0 - k.x);
    }
    for (int i = 0; i < 4; i++)
    {
        idx[i] = clamp(s - 1 + i, 0, n - 1);
        wt[i] = k[i];
    }
    return 4;
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

    int ix[4];
    int iy[4];
    float wx[4];
    float wy[4];
    const int kx = taps(gx, psc(scale_w), W, resize_type, ix, wx);
    const int ky = taps(gy, psc(scale_h), H, resize_h != 0 ? resize_type : 0, iy, wy);
    if (resize_type == 1)
    {
        buffer_cp1(top_blob_data, gi, bottom_blob_data, ci + iy[0] * W + ix[0]);
        return;
    }
    float sum = 0.0;
    for (int j = 0; j < ky; j++)
    {
        const int row = ci + iy[j] * W;
        float acc = 0.0;
        for (int i = 0; i < kx; i++)
            acc += wx[i] * float(buffer_ld1(bottom_blob_data, row + ix[i]));
        sum += wy[j] * acc;
    }
    buffer_st1(top_blob_data, gi, sum);
}
