#version 450
// Softmax along one axis of a blob viewed as (outer, n, inner): every line
// bottom[o][0..n)[i] becomes exp(x - max) / sum(exp(x - max)).
// cooperative = 1: one work group of 64 per line (gl_WorkGroupID = (i, o)), the invocations
//   stride over the line and shared-memory trees combine max and sum: long lines.
// cooperative = 0: one invocation per line (gl_GlobalInvocationID = (i, o)): short lines.
// Max and sum are float in every mode.
layout (local_size_x = 64) in;

layout (constant_id = 0) const int n = 0;
layout (constant_id = 1) const int inner = 0;
layout (constant_id = 2) const int outer = 0;
layout (constant_id = 3) const int cooperative = 0;

layout (binding = 0) readonly buffer bottom_blob { sfp bottom_blob_data[]; };
layout (binding = 1) buffer top_blob { sfp top_blob_data[]; };

layout (push_constant) uniform parameter
{
    int n;
    int inner;
    int outer;
} p;

shared float partial[64];

void main()
{
    const int N = psc(n);
    const int INNER = psc(inner);
    if (cooperative == 0)
    {
        const int i = int(gl_GlobalInvocationID.x);
        const int o = int(gl_GlobalInvocationID.y);
        if (i >= INNER || o >= psc(outer))
            return;
        const int base = o * N * INNER + i;
        float m = -3.402823466e+38;
        for (int k = 0; k < N; k++)
            m = max(m, float(buffer_ld1(bottom_blob_data, base + k * INNER)));
        float s = 0.0;
        for (int k = 0; k < N; k++)
            s += exp(float(buffer_ld1(bottom_blob_data, base + k * INNER)) - m);
        const float r = 1.0 / s;
        for (int k = 0; k < N; k++)
            buffer_st1(top_blob_data, base + k * INNER, exp(float(buffer_ld1(bottom_blob_data, base + k * INNER)) - m) * r);
        return;
    }

    // one group per line: no early return, every invocation reaches the barriers
    const int lid = int(gl_LocalInvocationID.x);
    const int base = int(gl_WorkGroupID.y) * N * INNER + int(gl_WorkGroupID.x);
    float m = -3.402823466e+38;
    for (int k = lid; k < N; k += 64)
        m = max(m, float(buffer_ld1(bottom_blob_data, base + k * INNER)));
    partial[lid] = m;
    barrier();
    for (int st = 32; st > 0; st >>= 1)
    {
        if (lid < st)
            partial[lid] = max(partial[lid], partial[lid + st]);
        barrier();
    }
    m = partial[0];
    barrier();  // everyone has read the max before partial is reused

    float s = 0.0;
    for (int k = lid; k < N; k += 64)
        s += exp(float(buffer_ld1(bottom_blob_data, base + k * INNER)) - m);
    partial[lid] = s;
    barrier();
    for (int st = 32; st > 0; st >>= 1)
    {
        if (lid < st)
            partial[lid] += partial[lid + st];
        barrier();
    }
    const float r = 1.0 / partial[0];
    for (int k = lid; k < N; k += 64)
        buffer_st1(top_blob_data, base + k * INNER, exp(float(buffer_ld1(bottom_blob_data, base + k * INNER)) - m) * r);
}
