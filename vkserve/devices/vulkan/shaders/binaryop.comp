#version 450
// BinaryOp out = op(a, b) over `size` vec4 elements (blobs are padded to whole vec4s), all
// ncnn op types (7..9 and 11 are the reverse forms). Elementwise: the executor may bind the
// output to an input's bytes. with_scalar: b is the scalar p.b (binding 1 is then unused).
// Broadcasting shapes use binaryop_broadcast.comp.
layout (constant_id = 0) const int op_type = 0;
layout (constant_id = 1) const int with_scalar = 0;

layout (binding = 0) readonly buffer a_blob { sfpvec4 a_blob_data[]; };
layout (binding = 1) readonly buffer b_blob { sfpvec4 b_blob_data[]; };
layout (binding = 2) buffer top_blob { sfpvec4 top_blob_data[]; };

layout (push_constant) uniform parameter
{
    int size;
    float b;
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
    const afpvec4 x = buffer_ld4(a_blob_data, gi);
    const afpvec4 y = with_scalar == 1 ? afpvec4(afp(p.b)) : buffer_ld4(b_blob_data, gi);
    buffer_st4(top_blob_data, gi, binary(x, y));
}
