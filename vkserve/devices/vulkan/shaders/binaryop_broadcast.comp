#version 450
// BinaryOp with ncnn broadcasting: `size` scalar outputs of a 4-D shape (d0, d1, d2, d3),
// d0 implied; a and b are read through their strides (0 along broadcast axes). Op types as
// in binaryop.comp.
layout (constant_id = 0) const int op_type = 0;

layout (binding = 0) readonly buffer a_blob { sfp a_blob_data[]; };
layout (binding = 1) readonly buffer b_blob { sfp b_blob_data[]; };
layout (binding = 2) buffer top_blob { sfp top_blob_data[]; };

layout (push_constant) uniform parameter
{
    int size;
    int d1;
    int d2;
    int d3;
    int as0;
    int as1;
    int as2;
    int as3;
    int bs0;
    int bs1;
    int bs2;
    int bs3;
} p;

afpvec4 binary(afpvec4 x, afpvec4 y)
{
    if (op_type == 0) return x + y;
    if (op_type == 1) return x - y;
    if (op_type == 2) return x * y;
    if (op_type == 3) return x / y;
    if (op_type == 4) return max(x, y);
    if (op_type == 5) return min(x, y);
    if (op_type == 6) return pow(x, y);
    if (op_type == 7) return y - x;
    if (op_type == 8) return y / x;
    if (op_type == 9) return pow(y, x);
    if (op_type == 10) return atan(x, y);
    return atan(y, x);
}

void main()
{
    // Linear index over a 2-D grid: dispatches of more than 65535 groups go along y too.
    const int gi = int(gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x
                       + gl_GlobalInvocationID.x);
    if (gi >= p.size)
        return;
    int t = gi;
    const int x3 = t % p.d3;
    t /= p.d3;
    const int x2 = t % p.d2;
    t /= p.d2;
    const int x1 = t % p.d1;
    const int x0 = t / p.d1;
    const int ai = x0 * p.as0 + x1 * p.as1 + x2 * p.as2 + x3 * p.as3;
    const int bi = x0 * p.bs0 + x1 * p.bs1 + x2 * p.bs2 + x3 * p.bs3;
    const afpvec4 x = afpvec4(buffer_ld1(a_blob_data, ai));
    const afpvec4 y = afpvec4(buffer_ld1(b_blob_data, bi));
    buffer_st1(top_blob_data, gi, binary(x, y).x);
}
