#version 450
// LayerNorm / RMSNorm / GroupNorm / InstanceNorm: a blob of `groups` runs of `run` elements,
// each normalised on its own by 64 / RUNS invocations of a work group of 64 that takes RUNS
// consecutive runs (work group index gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
// a whole work group past the end returns together, so no barrier is skipped by part of a
// group). Invocation q * RUNS + r reads elements q, q + 64 / RUNS, ... of the group's run r.
// Element k of run g is at blob index g * group_step + k * step: contiguous runs (step 1,
// group_step = run; RUNS = 1), or a LayerNorm over the channels of a channels-first blob (step =
// the pixels, group_step 1; a Permute pair folded, engine.fusion), where RUNS > 1 makes
// neighbouring invocations read neighbouring pixels of one channel instead of one value per
// 32-byte sector:
//   centered = 1: y = (x - mean) / sqrt(var + eps), var = mean((x - mean)^2) (two passes, as ncnn)
//   centered = 0: y = x / sqrt(mean(x^2) + eps)
// then, with affine = 1, y = y * gamma[k] (+ beta[k] when has_beta) for k = (i / aff_div) %
// aff_mod of the element's blob index i (LayerNorm: position in the run; GroupNorm: channel).
// Sums are float in every mode; shared-memory trees combine them (softmax.comp's pattern).
layout (local_size_x = 64) in;

layout (constant_id = 0) const int centered = 1;
layout (constant_id = 1) const int affine = 0;
layout (constant_id = 2) const int has_beta = 0;
layout (constant_id = 3) const int RUNS = 1;  // runs per work group: 1, 2, 4, ..., 64
const int LANES = 64 / RUNS;                  // invocations per run

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

// the sum of v over the LANES invocations of run r (this invocation: slice q)
float run_sum(int r, int q, float v)
{
    const int lid = q * RUNS + r;
    partial[lid] = v;
    barrier();
    for (int st = LANES / 2; st > 0; st >>= 1)
    {
        if (q < st)
            partial[lid] += partial[lid + st * RUNS];
        barrier();
    }
    const float s = partial[r];
    barrier();  // everyone has read the sum before partial is reused
    return s;
}

void main()
{
    const int wg = int(gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x);
    if (wg * RUNS >= p.groups)
        return;
    const int lid = int(gl_LocalInvocationID.x);
    const int r = lid % RUNS;
    const int q = lid / RUNS;
    const int g = wg * RUNS + r;
    const bool live = g < p.groups;  // runs past the end (the last group) read nothing but join the sums
    const int N = live ? p.run : 0;
    const int base = g * p.group_step;
    const int step = p.step;

    float mean = 0.0;
    if (centered == 1)
    {
        float s = 0.0;
        for (int k = q; k < N; k += LANES)
            s += float(buffer_ld1(bottom_blob_data, base + k * step));
        mean = run_sum(r, q, s) / float(p.run);
    }
    float sq = 0.0;
    for (int k = q; k < N; k += LANES)
    {
        const float d = float(buffer_ld1(bottom_blob_data, base + k * step)) - mean;
        sq += d * d;
    }
    const float var = run_sum(r, q, sq) / float(p.run);
    const float a = 1.0 / sqrt(var + p.eps);
    const float b = -mean * a;

    for (int k = q; k < N; k += LANES)
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
