#version 450
// Clip to [min, max] over a blob of `size` vec4 elements, in place.
layout (constant_id = 0) const float const_min = 0;
layout (constant_id = 1) const float const_max = 0;
layout (constant_id = 2) const int size = 0;

layout (binding = 0) buffer bottom_top_blob { sfpvec4 bottom_top_blob_data[]; };

layout (push_constant) uniform parameter
{
    float const_min;
    float const_max;
    int size;
} p;

void main()
{
    const int gi = int(gl_GlobalInvocationID.x);
    if (gi >= psc(size))
        return;
    afpvec4 v = buffer_ld4(bottom_top_blob_data, gi);
    v = clamp(v, afp(psc(const_min)), afp(psc(const_max)));
    buffer_st4(bottom_top_blob_data, gi, v);
}
