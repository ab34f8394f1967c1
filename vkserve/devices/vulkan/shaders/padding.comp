#version 450
// Padding and Crop: top[o][z][y][x] = bottom[o + offset_o][z - front][y - top][x - left] where
// that is inside the input, else the pad value (constant), the nearest edge element
// (replicate) or the mirrored one (reflect, edge not repeated), along z too. Blobs are viewed
// as (outer, d, h, w): a 3-D blob is (1, c, h, w), so front/behind pad its channels. Crop is
// this copy with negative front/top/left (every read inside the input) and a channel offset
// offset_o for 4-D blobs.
// gl_GlobalInvocationID = (out x, out y, o * outd + z); one element per invocation.
//
// pad: sfp [outer * outd] -- the pad value of each (o, z) plane (ncnn's per-channel pad data:
// per z of a 3-D blob, per o of a 4-D one; else the constant repeated; Crop binds one unused
// element).

layout (constant_id = 0) const int w = 0;
layout (constant_id = 1) const int h = 0;
layout (constant_id = 2) const int d = 0;
layout (constant_id = 3) const int outw = 0;
layout (constant_id = 4) const int outh = 0;
layout (constant_id = 5) const int outd = 0;
layout (constant_id = 6) const int outer = 0;     // outer count (of the output)
layout (constant_id = 7) const int left = 0;
layout (constant_id = 8) const int top = 0;
layout (constant_id = 9) const int front = 0;
layout (constant_id = 10) const int offset_o = 0;
layout (constant_id = 11) const int type = 0;     // 0 constant, 1 replicate, 2 reflect

layout (binding = 0) readonly buffer bottom_blob { sfp bottom_blob_data[]; };
layout (binding = 1) buffer top_blob { sfp top_blob_data[]; };
layout (binding = 2) readonly buffer pad_blob { sfp pad_data[]; };

layout (push_constant) uniform parameter
{
    int w;
    int h;
    int d;
    int outw;
    int outh;
    int outd;
    int outer;
    int left;
    int top;
    int front;
    int offset_o;
} p;

int edge(int i, int n)
{
    if (type == 1)
        return clamp(i, 0, n - 1);
    if (type == 2)
        return i < 0 ? -i : (i >= n ? 2 * (n - 1) - i : i);
    return i;
}

void main()
{
    const int gx = int(gl_GlobalInvocationID.x);
    const int gy = int(gl_GlobalInvocationID.y);
    const int gz = int(gl_GlobalInvocationID.z);
    const int OUTW = psc(outw);
    const int OUTH = psc(outh);
    const int OUTD = psc(outd);
    if (gx >= OUTW || gy >= OUTH || gz >= OUTD * psc(outer))
        return;

    const int W = psc(w);
    const int H = psc(h);
    const int D = psc(d);
    const int o = gz / OUTD;
    const int z = gz - o * OUTD;
    const int sx = edge(gx - psc(left), W);
    const int sy = edge(gy - psc(top), H);
    const int sz = edge(z - psc(front), D);
    const int gi = (gz * OUTH + gy) * OUTW + gx;
    if (uint(sx) < uint(W) && uint(sy) < uint(H) && uint(sz) < uint(D))
    {
        const int si = (((o + psc(offset_o)) * D + sz) * H + sy) * W + sx;
        buffer_cp1(top_blob_data, gi, bottom_blob_data, si);
    }
    else
    {
        buffer_cp1(top_blob_data, gi, pad_data, gz);
    }
}
