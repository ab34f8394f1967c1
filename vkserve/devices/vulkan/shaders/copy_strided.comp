#version 450
// Strided copy of a 4-D region of `size` elements, shape (d0, d1, d2, d3) with d0 implied:
// element (x0, x1, x2, x3) goes from src[src_offset + sum(xk * sk)] to
// dst[dst_offset + sum(xk * tk)]. Serves Concat (one dispatch per input), Slice (one per
// output), Permute, ShuffleChannel and Crop-like windows; copies are exact in every mode.
layout (binding = 0) readonly buffer bottom_blob { sfp bottom_blob_data[]; };
layout (binding = 1) buffer top_blob { sfp top_blob_data[]; };

layout (push_constant) uniform parameter
{
    int size;
    int d1;
    int d2;
    int d3;
    int src_offset;
    int s0;
    int s1;
    int s2;
    int s3;
    int dst_offset;
    int t0;
    int t1;
    int t2;
    int t3;
} p;

void main()
{
    // Linear index over a 2-D grid: dispatches of more than 65535 groups go along y too.
    const int gi = int(gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x
                       + gl_GlobalInvocationID.x);
    if (gi >= p.size)
        return;
    int t = gi;
    const int x3 = t % p.d3;
    t /= p.d3;
    const int x2 = t % p.d2;
    t /= p.d2;
    const int x1 = t % p.d1;
    const int x0 = t / p.d1;
    const int si = p.src_offset + x0 * p.s0 + x1 * p.s1 + x2 * p.s2 + x3 * p.s3;
    const int di = p.dst_offset + x0 * p.t0 + x1 * p.t1 + x2 * p.t2 + x3 * p.t3;
    buffer_cp1(top_blob_data, di, bottom_blob_data, si);
}
