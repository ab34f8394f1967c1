#version 450
// 1x1 convolution, stride 1, no padding, one group: a GEMM top[oc][p] = sum_ic W[oc][ic] bottom[ic][p]
// over p = y * w + x. One invocation computes a 4 x 4 block: 4 output channels (one vec4 weight
// load per input channel) times 4 pixels p0 + j * quarter (j = 0..3), so that neighbouring
// invocations read neighbouring pixels (coalesced) and each loaded value feeds 4 FMAs.
// gl_GlobalInvocationID = (p0 in [0, quarter), oc tile, 1).
//
// weight: sfpvec4 [tile][ic] (4 output channels; past outc zero), bias: sfpvec4 [tile].
// Sums are float in every mode.

layout (constant_id = 0) const int size = 0;      // pixels: w * h
layout (constant_id = 1) const int quarter = 0;   // ceil(size / 4)
layout (constant_id = 2) const int c = 0;         // input channels
layout (constant_id = 3) const int outc = 0;
layout (constant_id = 4) const int activation_type = 0;
layout (constant_id = 5) const float activation_param_0 = 0;
layout (constant_id = 6) const float activation_param_1 = 0;

layout (binding = 0) readonly buffer bottom_blob { sfp bottom_blob_data[]; };
layout (binding = 1) buffer top_blob { sfp top_blob_data[]; };
layout (binding = 2) readonly buffer weight_blob { sfpvec4 weight_data[]; };
layout (binding = 3) readonly buffer bias_blob { sfpvec4 bias_data[]; };

layout (push_constant) uniform parameter
{
    int size;
    int quarter;
    int c;
    int outc;
} p;

float activate(float v)
{
    if (activation_type == 1)
        return max(v, 0.0);
    if (activation_type == 2)
        return v < 0.0 ? v * activation_param_0 : v;
    if (activation_type == 3)
        return clamp(v, activation_param_0, activation_param_1);
    if (activation_type == 4)
        return 1.0 / (1.0 + exp(-v));
    if (activation_type == 5)
    {
        // x * tanh(softplus(x)); tanh from exp(-2 sp) with sp >= 0 cannot overflow
        float sp = v > 20.0 ? v : log(1.0 + exp(v));
        float t = exp(-2.0 * sp);
        return v * (1.0 - t) / (1.0 + t);
    }
    if (activation_type == 6)
        return v * clamp(v * activation_param_0 + activation_param_1, 0.0, 1.0);
    return v;
}

void main()
{
    const int gx = int(gl_GlobalInvocationID.x);
    const int gy = int(gl_GlobalInvocationID.y);
    const int SIZE = psc(size);
    const int Q = psc(quarter);
    const int OUTC = psc(outc);
    if (gx >= Q || gy * 4 >= OUTC)
        return;

    // pixels of this invocation; the ones past the end (only in the last quarter) read
    // pixel size-1 instead, so the loop has no branch, and are not stored
    const ivec4 px = gx + ivec4(0, 1, 2, 3) * Q;
    const ivec4 src = min(px, ivec4(SIZE - 1));

    const vec4 b = vec4(buffer_ld4(bias_data, gy));
    vec4 s0 = b;  // pixel j: s<j>[k] = output channel gy * 4 + k
    vec4 s1 = b;
    vec4 s2 = b;
    vec4 s3 = b;
    const int C = psc(c);
    int wi = gy * C;
    int ci = 0;
    for (int ic = 0; ic < C; ic++)
    {
        const vec4 k = vec4(buffer_ld4(weight_data, wi));
        s0 += float(buffer_ld1(bottom_blob_data, ci + src.x)) * k;
        s1 += float(buffer_ld1(bottom_blob_data, ci + src.y)) * k;
        s2 += float(buffer_ld1(bottom_blob_data, ci + src.z)) * k;
        s3 += float(buffer_ld1(bottom_blob_data, ci + src.w)) * k;
        wi++;
        ci += SIZE;
    }

    const mat4 s = mat4(s0, s1, s2, s3);  // s[j][k]
    for (int k = 0; k < 4; k++)
    {
        const int oc = gy * 4 + k;
        if (oc < OUTC)
        {
            for (int j = 0; j < 4; j++)
            {
                if (px[j] < SIZE)
                {
                    buffer_st1(top_blob_data, oc * SIZE + px[j], activate(s[j][k]));
                }
            }
        }
    }
}
