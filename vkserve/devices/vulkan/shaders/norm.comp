#version 450
// LayerNorm / RMSNorm / GroupNorm / InstanceNorm: a blob of `groups` contiguous runs of
// `run` elements, each normalised on its own by one work group of 64 (group index
// gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x; a whole work group past the end
// returns together, so no barrier is skipped by part of a group):
//   centered = 1: y = (x - mean) / sqrt(var + eps), var = mean((x - mean)^2) (two passes, as ncnn)
//   centered = 0: y = x / sqrt(mean(x^2) + eps)
// then, with affine = 1, y = y * gamma[k] (+ beta[k] when has_beta) for k = (i / aff_div) %
// aff_mod of the element's blob index i (LayerNorm: position in the run; GroupNorm: channel).
// Sums are float in every mode; shared-memory trees combine them (softmax.comp's pattern).
// With subgroup_rows = R > 0 (short runs, devices with subgroup arithmetic) a work group
// normalises R runs, each by one subgroup (subgroup s takes runs s, s + subgroups, ... of its
// work group's R, whatever the driver's subgroup size), and subgroupAdd combines the sums:
// no barriers.
#if ncnn_subgroup_arithmetic
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif
layout (local_size_x = 64) in;

layout (constant_id = 0) const int centered = 1;
layout (constant_id = 1) const int affine = 0;
layout (constant_id = 2) const int has_beta = 0;
layout (constant_id = 3) const int subgroup_rows = 0;  // R, 0: one run per work group

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
} p;

shared float partial[64];

int lid;  // gl_LocalInvocationID.x

// the sum of `v` over the invocations that share a run
float run_sum(float v)
{
#if ncnn_subgroup_arithmetic
    if (subgroup_rows > 0)
        return subgroupAdd(v);
#endif
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

// run g, its elements shared by `lanes` invocations from `lane`
void normalize(int g, int lane, int lanes)
{
    const int N = p.run;
    const int base = g * N;

    float mean = 0.0;
    if (centered == 1)
    {
        float s = 0.0;
        for (int k = lane; k < N; k += lanes)
            s += float(buffer_ld1(bottom_blob_data, base + k));
        mean = run_sum(s) / float(N);
    }
    float sq = 0.0;
    for (int k = lane; k < N; k += lanes)
    {
        const float d = float(buffer_ld1(bottom_blob_data, base + k)) - mean;
        sq += d * d;
    }
    const float var = run_sum(sq) / float(N);
    const float a = 1.0 / sqrt(var + p.eps);
    const float b = -mean * a;

    for (int k = lane; k < N; k += lanes)
    {
        const int i = base + k;
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

void main()
{
    const int wg = int(gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x);
    lid = int(gl_LocalInvocationID.x);
#if ncnn_subgroup_arithmetic
    if (subgroup_rows > 0)
    {
        for (int r = int(gl_SubgroupID); r < subgroup_rows; r += int(gl_NumSubgroups))
        {
            const int g = wg * subgroup_rows + r;
            if (g < p.groups)  // uniform in the subgroup
                normalize(g, int(gl_SubgroupInvocationID), int(gl_SubgroupSize));
        }
        return;
    }
#endif
    if (wg < p.groups)  // a whole work group past the end returns together: no barrier skipped
        normalize(wg, lid, 64);
}
