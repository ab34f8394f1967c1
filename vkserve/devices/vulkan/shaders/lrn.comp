#version 450
// LRN: top = x * pow(bias + alpha / norm * sum(x'^2), -beta) over the window around each
// element: across channels (region_type 0: channels q - size/2 .. q + size/2, norm = size)
// or within the channel (region_type 1: a size x size square from (y, x) - size/2,
// norm = size * size); window parts outside the blob count as 0.
// One element per invocation: (x, y, channel). Sums are float in every mode.

layout (constant_id = 0) const int w = 0;
layout (constant_id = 1) const int h = 0;
layout (constant_id = 2) const int c = 0;
layout (constant_id = 3) const int local_size = 0;
layout (constant_id = 4) const int region_type = 0;
layout (constant_id = 5) const float alpha = 0;
layout (constant_id = 6) const float beta = 0;
layout (constant_id = 7) const float bias = 0;

layout (binding = 0) readonly buffer bottom_blob { sfp bottom_blob_data[]; };
layout (binding = 1) buffer top_blob { sfp top_blob_data[]; };

layout (push_constant) uniform parameter
{
    int w;
    int h;
    int c;
    int local_size;
} p;

void main()
{
    const int gx = int(gl_GlobalInvocationID.x);
    const int gy = int(gl_GlobalInvocationID.y);
    const int gz = int(gl_GlobalInvocationID.z);
    const int W = psc(w);
    const int H = psc(h);
    const int C = psc(c);
    if (gx >= W || gy >= H || gz >= C)
        return;

    const int S = psc(local_size);
    const int half_size = S / 2;
    const int plane = W * H;
    const int gi = gz * plane + gy * W + gx;
    float sum = 0.0;
    float norm;
    if (region_type == 0)
    {
        const int q0 = max(gz - half_size, 0);
        const int q1 = min(gz + half_size, C - 1);
        for (int q = q0; q <= q1; q++)
        {
            const float v = float(buffer_ld1(bottom_blob_data, gi + (q - gz) * plane));
            sum += v * v;
        }
        norm = float(S);
    }
    else
    {
        const int y0 = max(gy - half_size, 0);
        const int y1 = min(gy - half_size + S, H);
        const int x0 = max(gx - half_size, 0);
        const int x1 = min(gx - half_size + S, W);
        for (int y = y0; y < y1; y++)
        {
            for (int x = x0; x < x1; x++)
            {
                const float v = float(buffer_ld1(bottom_blob_data, gz * plane + y * W + x));
                sum += v * v;
            }
        }
        norm = float(S * S);
    }
    const float x = float(buffer_ld1(bottom_blob_data, gi));
    buffer_st1(top_blob_data, gi, x * pow(bias + alpha / norm * sum, -beta));
}
