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

// f rounded to the nearest float16 value (ties to even), as a float. Done with integer and
// exact float steps because packHalf2x16's rounding is the driver's choice (an NVIDIA driver
// does not round to nearest; lavapipe does).
float round_to_half(float f)
{
    const uint x = floatBitsToUint(f);
    const uint sign = x & 0x80000000u;
    const uint a = x & 0x7fffffffu;
    if (a >= 0x7f800000u)
        return f; // inf, nan
    if (a >= 0x477ff000u)
        return uintBitsToFloat(sign | 0x7f800000u); // 65520 and up round to infinity
    if (a < 0x38800000u)
    {
        // below the smallest normal float16: a multiple of 2^-24 (the scaling is exact)
        const float q = roundEven(abs(f) * 16777216.0) / 16777216.0;
        return uintBitsToFloat(sign | floatBitsToUint(q));
    }
    return uintBitsToFloat(sign | ((a + 0x0fffu + ((a >> 13) & 1u)) & 0xffffe000u));
}

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
        v = vec4(round_to_half(v.x), round_to_half(v.y), round_to_half(v.z), round_to_half(v.w));
    }
    else
    {
        uvec4 bits = floatBitsToUint(v);
        bits = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;
        v = uintBitsToFloat(bits);
    }
    buffer_st4(top_blob_data, gi, afpvec4(v));
}
