#version 450
// PReLU over `size` vec4 elements: x < 0 ? x * slope : x, out of place (elementwise safe).
// Element k's slope is slope[min(k / inner, num_slope - 1)]: inner = elements per channel
// (the channel axis is the blob's first), num_slope 1 = one slope for all. Padding lanes past
// the blob clamp to the last slope.
layout (binding = 0) readonly buffer bottom_blob { sfpvec4 bottom_blob_data[]; };
layout (binding = 1) buffer top_blob { sfpvec4 top_blob_data[]; };
layout (binding = 2) readonly buffer slope_blob { sfp slope_data[]; };

layout (push_constant) uniform parameter
{
    int size;
    int inner;
    int num_slope;
} p;

void main()
{
    const int gi = int(gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x
                       + gl_GlobalInvocationID.x);
    if (gi >= p.size)
        return;
    const vec4 v = vec4(buffer_ld4(bottom_blob_data, gi));
    vec4 s;
    for (int k = 0; k < 4; k++)
        s[k] = float(buffer_ld1(slope_data, min((gi * 4 + k) / p.inner, p.num_slope - 1)));
    buffer_st4(top_blob_data, gi, afpvec4(mix(v, v * s, lessThan(v, vec4(0.0)))));
}
