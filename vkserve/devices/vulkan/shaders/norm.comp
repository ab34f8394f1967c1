#version 450
// LayerNorm / RMSNorm / GroupNorm / InstanceNorm: a blob of `groups` runs of `run` elements,
// each normalised on its own by one work group of 64 (group index gl_WorkGroupID.y *
// gl_NumWorkGroups.x + gl_WorkGroupID.x; a whole work group past the end returns together, so
// no barrier is skipped by part of a group). Element k of run g is at blob index g * group_step
// + k * step: contiguous runs (step 1, group_step = run), or a LayerNorm over the channels of a
// channels-first blob (step = the pixels, group_step 1; a Permute pair folded, engine.fusion):
//   centered = 1: y = (x - mean) / sqrt(var + eps), var = mean((x - mean)^2) (two passes, as ncnn)
//   centered = 0: y = x / sqrt(mean(x^2) + eps)
// then, with affine = 1, y = y * gamma[k] (+ beta[k] when has_beta) for k = (i / aff_div) %
// aff_mod of the element's blob index i (LayerNorm: position in the run; GroupNorm: channel).
// Sums are float in every mode; shared-memory trees combine them (softmax.comp's pattern).
layout (local_size_x = 64) in;

layout (constant_id = 0) const int centered = 1;
layout (constant_id = 1) const int affine = 0;
layout (constant_id = 2) const int has_beta = 0;

layout (binding = 0) readonly buffer bottom_blob { sfp bottom_blob_data[]; };
layout (binding = 1) buffer top_blob { sfp top_blob_data[]; };
layout (binding = 2) readonly buffer gamma_blob { sfp gamma_data[]; };
layout (binding = 3) readonly buffer beta_blob { sfp beta_data[]; };

layout (push_constant) uniform parameter
{
    int run;
    int groups;
    int aff_div;
    int aff_mod;
    float eps;
    int group_step;
    int step;
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
    const int base = g * p.group_step;
    const int step = p.step;

    float mean = 0.0;
    if (centered == 1)
    {
        float s = 0.0;
        for (int k = lid; k < N; k += 64)
            s += float(buffer_ld1(bottom_blob_data, base + k * step));
        mean = group_sum(lid, s) / float(N);
    }
    float sq = 0.0;
    for (int k = lid; k < N; k += 64)
    {
        const float d = float(buffer_ld1(bottom_blob_data, base + k * step)) - mean;
        sq += d * d;
    }
    const float var = group_sum(lid, sq) / float(N);
    const float a = 1.0 / sqrt(var + p.eps);
    const float b = -mean * a;

    for (int k = lid; k < N; k += 64)
    {
        const int i = base + k * step;
        float y = float(buffer_ld1(bottom_blob_data, i)) * a + b;
        if (affine == 1)
        {
            const int j = (i / p.aff_div) % p.aff_mod;
            y = y * float(buffer_ld1(gamma_data, j));
            if (has_beta == 1)
                y = y + float(buffer_ld1(beta_data, j));
        }
        buffer_st1(top_blob_data, i, afp(y));
    }
}
