#version 450
// Global max / average pooling: (c, h, w) -> (c,). One work group of 64 per channel
// (gl_WorkGroupID.x): each invocation reduces a strided part of the channel, then a
// shared-memory tree combines the 64 partial results. Sums are float in every mode.
layout (local_size_x = 64) in;

layout (constant_id = 0) const int size = 0;  // h * w
layout (constant_id = 1) const int c = 0;
layout (constant_id = 2) const int pooling_type = 0;  // 0 max, 1 average

layout (binding = 0) readonly buffer bottom_blob { sfp bottom_blob_data[]; };
layout (binding = 1) buffer top_blob { sfp top_blob_data[]; };

layout (push_constant) uniform parameter
{
    int size;
    int c;
} p;

shared float partial[64];

void main()
{
    const int q = int(gl_WorkGroupID.x);
    const int lid = int(gl_LocalInvocationID.x);
    const int SIZE = psc(size);
    // q < c always (one group per channel): no early return, every invocation reaches the barriers

    const int base = q * SIZE;
    float acc = pooling_type == 0 ? -3.402823466e+38 : 0.0;
    for (int i = lid; i < SIZE; i += 64)
    {
        const float v = float(buffer_ld1(bottom_blob_data, base + i));
        acc = pooling_type == 0 ? max(acc, v) : acc + v;
    }
    partial[lid] = acc;
    barrier();
    for (int s = 32; s > 0; s >>= 1)
    {
        if (lid < s)
            partial[lid] = pooling_type == 0 ? max(partial[lid], partial[lid + s]) : partial[lid] + partial[lid + s];
        barrier();
    }
    if (lid == 0)
    {
        const float res = pooling_type == 0 ? partial[0] : partial[0] / float(SIZE);
        buffer_st1(top_blob_data, q, res);
    }
}
