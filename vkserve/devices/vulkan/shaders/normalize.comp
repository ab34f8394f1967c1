#version 450
// MVN and Normalize: `groups` runs of `run` elements, element k of run g at g * gstride +
// k * estride, each normalised on its own by one work group of 64 (group index
// gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x; a whole work group past the end
// returns together, so no barrier is skipped by part of a group). Sums are float in every
// mode; shared-memory trees combine them.
//   kind 0 (MVN): y = x - mean, times 1 / (sqrt(mean(y^2)) + eps) when flag = 1
//   kind 1 (Normalize): y = x * a * scale[c], a from the sum of squares s by eps_mode = flag
//       (0: 1 / sqrt(s + eps), 1: 1 / max(sqrt(s), eps), 2: 1 / sqrt(max(s, eps))),
//       c = (element index / cstep) (0 with shared = 1)
layout (local_size_x = 64) in;

layout (constant_id = 0) const int kind = 0;
layout (constant_id = 1) const int flag = 0;
layout (constant_id = 2) const int shared_scale = 0;

layout (binding = 0) readonly buffer bottom_blob { sfp bottom_blob_data[]; };
layout (binding = 1) buffer top_blob { sfp top_blob_data[]; };
layout (binding = 2) readonly buffer scale_blob { sfp scale_data[]; };

layout (push_constant) uniform parameter
{
    int run;
    int groups;
    int gstride;
    int estride;
    int cstep;
    float eps;
} p;

shared float partial[64];

float group_sum(int lid, float v)
{
    partial[lid] = v;
    barrier();
    for (int st = 32; st > 0; st >>= 1)
    {
        if (lid < st)
            partial[lid] += partial[lid + st];
        barrier();
    }
    const float s = partial[0];
    barrier();  // everyone has read the sum before partial is reused
    return s;
}

void main()
{
    const int g = int(gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x);
    if (g >= p.groups)
        return;
    const int lid = int(gl_LocalInvocationID.x);
    const int N = p.run;
    const int base = g * p.gstride;

    float mean = 0.0;
    if (kind == 0)
    {
        float s = 0.0;
        for (int k = lid; k < N; k += 64)
            s += float(buffer_ld1(bottom_blob_data, base + k * p.estride));
        mean = group_sum(lid, s) / float(N);
    }
    float a = 1.0;
    if (kind == 1 || flag == 1)
    {
        float sq = 0.0;
        for (int k = lid; k < N; k += 64)
        {
            const float d = float(buffer_ld1(bottom_blob_data, base + k * p.estride)) - mean;
            sq += d * d;
        }
        const float s = group_sum(lid, sq);
        if (kind == 0)
            a = 1.0 / (sqrt(s / float(N)) + p.eps);
        else if (flag == 0)
            a = 1.0 / sqrt(s + p.eps);
        else if (flag == 1)
            a = 1.0 / max(sqrt(s), p.eps);
        else
            a = 1.0 / sqrt(max(s, p.eps));
    }

    for (int k = lid; k < N; k += 64)
    {
        const int i = base + k * p.estride;
        float y = (float(buffer_ld1(bottom_blob_data, i)) - mean) * a;
        if (kind == 1)
            y *= float(buffer_ld1(scale_data, shared_scale == 1 ? 0 : i / p.cstep));
        buffer_st1(top_blob_data, i, afp(y));
    }
}
