#version 450
// Elementwise activations over `size` vec4 elements (blobs are padded to whole vec4s),
// out of place; the executor may bind bottom and top to the same bytes (elementwise safe).
// op: 0 ReLU / leaky ReLU (a = slope), 1 Clip (a = min, b = max), 2 Sigmoid, 3 Swish,
//     4 HardSigmoid (a = alpha, b = beta), 5 HardSwish (a = alpha, b = beta), 6 scale by a.
layout (constant_id = 0) const int op = 0;

layout (binding = 0) readonly buffer bottom_blob { sfpvec4 bottom_blob_data[]; };
layout (binding = 1) buffer top_blob { sfpvec4 top_blob_data[]; };

layout (push_constant) uniform parameter
{
    int size;
    float a;
    float b;
} p;

void main()
{
    // Linear index over a 2-D grid: dispatches of more than 65535 groups go along y too.
    const int gi = int(gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x
                       + gl_GlobalInvocationID.x);
    if (gi >= p.size)
        return;
    afpvec4 v = buffer_ld4(bottom_blob_data, gi);
    const afp a = afp(p.a);
    const afp b = afp(p.b);
    if (op == 0)
        v = mix(v * a, v, greaterThanEqual(v, afpvec4(0)));
    else if (op == 1)
        v = clamp(v, a, b);
    else if (op == 2)
        v = afpvec4(1) / (afpvec4(1) + exp(-v));
    else if (op == 3)
        v = v / (afpvec4(1) + exp(-v));
    else if (op == 4)
        v = clamp(v * a + b, afp(0), afp(1));
    else if (op == 5)
        v = v * clamp(v * a + b, afp(0), afp(1));
    else
        v = v * a;
    buffer_st4(top_blob_data, gi, v);
}
