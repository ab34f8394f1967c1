#version 450
// Embed: output (words, num_output); element (q, o) = weight[id_q * num_output + o]
// (+ bias[o]), id_q the value of input element q truncated toward zero, clamped to
// [0, input_dim - 1].
layout (constant_id = 0) const int bias_term = 0;

layout (binding = 0) readonly buffer bottom_blob { sfp bottom_blob_data[]; };
layout (binding = 1) buffer top_blob { sfp top_blob_data[]; };
layout (binding = 2) readonly buffer weight_blob { sfp weight_data[]; };
layout (binding = 3) readonly buffer bias_blob { sfp bias_data[]; };

layout (push_constant) uniform parameter
{
    int size;
    int num_output;
    int input_dim;
} p;

void main()
{
    // Linear index over a 2-D grid: dispatches of more than 65535 groups go along y too.
    const int gi = int(gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x
                       + gl_GlobalInvocationID.x);
    if (gi >= p.size)
        return;
    const int q = gi / p.num_output;
    const int o = gi - q * p.num_output;
    const float id = clamp(trunc(float(buffer_ld1(bottom_blob_data, q))), 0.0, float(p.input_dim - 1));
    float y = float(buffer_ld1(weight_data, int(id) * p.num_output + o));
    if (bias_term == 1)
        y += float(buffer_ld1(bias_data, o));
    buffer_st1(top_blob_data, gi, afp(y));
}
