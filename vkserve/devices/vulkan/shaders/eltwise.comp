#version 450
// Eltwise of two blobs over `size` vec4 elements (blobs are padded to whole vec4s):
// op_type 0 prod, 1 sum with coefficients (out = a * ca + b * cb), 2 max. An n-input Eltwise
// is a chain of these, the output taking the place of a after the first.
layout (constant_id = 0) const int op_type = 0;

layout (binding = 0) readonly buffer a_blob { sfpvec4 a_blob_data[]; };
layout (binding = 1) readonly buffer b_blob { sfpvec4 b_blob_data[]; };
layout (binding = 2) buffer top_blob { sfpvec4 top_blob_data[]; };

layout (push_constant) uniform parameter
{
    int size;
    float ca;
    float cb;
} p;

void main()
{
    // Linear index over a 2-D grid: dispatches of more than 65535 groups go along y too.
    const int gi = int(gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x
                       + gl_GlobalInvocationID.x);
    if (gi >= p.size)
        return;
    const afpvec4 a = buffer_ld4(a_blob_data, gi);
    const afpvec4 b = buffer_ld4(b_blob_data, gi);
    afpvec4 v;
    if (op_type == 0)
        v = a * b;
    else if (op_type == 1)
        v = a * afp(p.ca) + b * afp(p.cb);
    else
        v = max(a, b);
    buffer_st4(top_blob_data, gi, v);
}
