#version 450
// InnerProduct as a GEMV, num_input a multiple of 4: innerproduct.comp reading vec4s.
// top[r][o] = activate(bias[o] + sum_i weight[o][i] * bottom[r][i]).
// One work group of 64 per output (gl_WorkGroupID.x = o, .y = row r of a 2-D input, else 0):
// the invocations read a weight row and the input as vec4s in coalesced strides of 64 (two
// in flight per invocation), then a shared-memory tree adds the 64 partial sums. Sums are
// float in every mode.
//
// weight: sfpvec4 [num_output][num_input / 4] (ncnn's order), bias: sfp [num_output] (zeros
// without bias). The input is read as sfpvec4 too: rows start at multiples of 4 elements.
layout (local_size_x = 64) in;

layout (constant_id = 0) const int num_input = 0;
layout (constant_id = 1) const int num_output = 0;
layout (constant_id = 2) const int activation_type = 0;
layout (constant_id = 3) const float activation_param_0 = 0;
layout (constant_id = 4) const float activation_param_1 = 0;

layout (binding = 0) readonly buffer bottom_blob { sfpvec4 bottom_blob_data[]; };
layout (binding = 1) buffer top_blob { sfp top_blob_data[]; };
layout (binding = 2) readonly buffer weight_blob { sfpvec4 weight_data[]; };
layout (binding = 3) readonly buffer bias_blob { sfp bias_data[]; };

layout (push_constant) uniform parameter
{
    int num_input;
    int num_output;
} p;

shared float partial[64];

#include "activate.h"

void main()
{
    const int o = int(gl_WorkGroupID.x);
    const int r = int(gl_WorkGroupID.y);
    const int lid = int(gl_LocalInvocationID.x);
    const int N = psc(num_input);
    // one group per output and row: no early return, every invocation reaches the barriers

    const int N4 = N / 4;
    const int wbase = o * N4;
    const int xbase = r * N4;
    vec4 s0 = vec4(0.0);
    vec4 s1 = vec4(0.0);
    int i = lid;
    for (; i + 64 < N4; i += 128)
    {
        s0 += vec4(buffer_ld4(weight_data, wbase + i)) * vec4(buffer_ld4(bottom_blob_data, xbase + i));
        s1 += vec4(buffer_ld4(weight_data, wbase + i + 64)) * vec4(buffer_ld4(bottom_blob_data, xbase + i + 64));
    }
    if (i < N4)
        s0 += vec4(buffer_ld4(weight_data, wbase + i)) * vec4(buffer_ld4(bottom_blob_data, xbase + i));
    const vec4 s4 = s0 + s1;
    const float sum = (s4.x + s4.y) + (s4.z + s4.w);
    partial[lid] = sum;
    barrier();
    for (int s = 32; s > 0; s >>= 1)
    {
        if (lid < s)
            partial[lid] += partial[lid + s];
        barrier();
    }
    if (lid == 0)
    {
        const float v = partial[0] + float(buffer_ld1(bias_data, o));
        buffer_st1(top_blob_data, r * psc(num_output) + o, activate(v));
    }
}
