#version 450
// Per-channel affine map (BatchNorm, Scale, Bias): a blob of `channels` contiguous runs of
// `inner` elements each; top[i] = bottom[i] * scale[c] + shift[c] with c = i / inner.
// has_scale / has_shift = 0 leave out the product / the sum (their binding is then a dummy).
// One element per invocation; out of place, reads element i only to write element i (the
// executor may bind bottom and top to the same bytes).
layout (constant_id = 0) const int has_scale = 1;
layout (constant_id = 1) const int has_shift = 1;

layout (binding = 0) readonly buffer bottom_blob { sfp bottom_blob_data[]; };
layout (binding = 1) buffer top_blob { sfp top_blob_data[]; };
layout (binding = 2) readonly buffer scale_blob { sfp scale_data[]; };
layout (binding = 3) readonly buffer shift_blob { sfp shift_data[]; };

layout (push_constant) uniform parameter
{
    int size;
    int inner;
} p;

void main()
{
    // Linear index over a 2-D grid: dispatches of more than 65535 groups go along y too.
    const int gi = int(gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x
                       + gl_GlobalInvocationID.x);
    if (gi >= p.size)
        return;
    const int c = gi / p.inner;
    afp v = buffer_ld1(bottom_blob_data, gi);
    if (has_scale == 1)
        v = v * buffer_ld1(scale_data, c);
    if (has_shift == 1)
        v = v + buffer_ld1(shift_data, c);
    buffer_st1(top_blob_data, gi, v);
}
