#version 450
// ReLU / leaky ReLU over a blob of `size` vec4 elements, in place.
layout (constant_id = 0) const float slope = 0;
layout (constant_id = 1) const int size = 0;

layout (binding = 0) buffer bottom_top_blob { sfpvec4 bottom_top_blob_data[]; };

layout (push_constant) uniform parameter
{
    float slope;
    int size;
} p;

void main()
{
    const int gi = int(gl_GlobalInvocationID.x);
    if (gi >= psc(size))
        return;
    afpvec4 v = buffer_ld4(bottom_top_blob_data, gi);
    afp s = afp(psc(slope));
    v = mix(v * s, v, greaterThanEqual(v, afpvec4(0)));
    buffer_st4(bottom_top_blob_data, gi, v);
}
