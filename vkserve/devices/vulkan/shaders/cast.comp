#version 450
// Cast as value rounding over `size` vec4 elements, computed in float: to_type 2 rounds to
// float16, 4 to bfloat16 (both to nearest, ties to even). Elementwise: the executor may bind
// the output to the input's bytes.
layout (constant_id = 0) const int to_type = 2;

layout (binding = 0) readonly buffer bottom_blob { sfpvec4 bottom_blob_data[]; };
layout (binding = 1) buffer top_blob { sfpvec4 top_blob_data[]; };

layout (push_constant) uniform parameter
{
    int size;
} p;

void main()
{
    // Linear index over a 2-D grid: dispatches of more than 65535 groups go along y too.
    const int gi = int(gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x
                       + gl_GlobalInvocationID.x);
    if (gi >= p.size)
        return;
    vec4 v = vec4(buffer_ld4(bottom_blob_data, gi));
    if (to_type == 2)
    {
        v = vec4(unpackHalf2x16(packHalf2x16(v.xy)), unpackHalf2x16(packHalf2x16(v.zw)));
    }
    else
    {
        uvec4 bits = floatBitsToUint(v);
        bits = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;
        v = uintBitsToFloat(bits);
    }
    buffer_st4(top_blob_data, gi, afpvec4(v));
}
