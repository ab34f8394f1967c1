#version 450
// GLU: the input seen as (outer, 2, block); output element o = (outer, k) of (outer, block) is
// a * sigmoid(b) with a = x[outer, 0, k], b = x[outer, 1, k] (ncnn: a * (1 / (1 + exp(-b)))),
// computed in float in every mode.
layout (binding = 0) readonly buffer bottom_blob { sfp bottom_blob_data[]; };
layout (binding = 1) buffer top_blob { sfp top_blob_data[]; };

layout (push_constant) uniform parameter
{
    int size;
    int block;
} p;

void main()
{
    // Linear index over a 2-D grid: dispatches of more than 65535 groups go along y too.
    const int gi = int(gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x
                       + gl_GlobalInvocationID.x);
    if (gi >= p.size)
        return;
    const int outer = gi / p.block;
    const int ia = gi + outer * p.block;
    const float a = float(buffer_ld1(bottom_blob_data, ia));
    const float b = float(buffer_ld1(bottom_blob_data, ia + p.block));
    buffer_st1(top_blob_data, gi, afp(a * (1.0 / (1.0 + exp(-b)))));
}
