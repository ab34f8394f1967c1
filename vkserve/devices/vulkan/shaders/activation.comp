#version 450
// Element-wise activations / math over `size` vec4 elements (blobs are padded to whole vec4s),
// out of place; the executor may bind bottom and top to the same bytes (elementwise safe).
// Computed in float in every precision mode (exp / pow overflow half early).
// op: 0 TanH, 1 AbsVal, 2 ELU (a = alpha), 3 SELU (a = alpha * lambda, b = lambda), 4 Mish,
//     5 Softplus, 6 GELU erf form, 7 GELU tanh form, 8 Exp (a = base, -1 = e; b = scale,
//     c = shift), 9 Log (as Exp), 10 Power (a = power, b = scale, c = shift), 11 Erf,
//     12 Threshold (a = threshold).
layout (constant_id = 0) const int op = 0;

layout (binding = 0) readonly buffer bottom_blob { sfpvec4 bottom_blob_data[]; };
layout (binding = 1) buffer top_blob { sfpvec4 top_blob_data[]; };

layout (push_constant) uniform parameter
{
    int size;
    float a;
    float b;
    float c;
} p;

#include "fmath.h"

vec4 erf4(vec4 x)
{
    return vec4(erf1(x.x), erf1(x.y), erf1(x.z), erf1(x.w));
}

vec4 tanh4(vec4 x)
{
    return vec4(tanh1(x.x), tanh1(x.y), tanh1(x.z), tanh1(x.w));
}

// log(exp(x) + 1) without overflow
vec4 softplus4(vec4 x)
{
    return max(x, 0.0) + log(1.0 + exp(-abs(x)));
}

// powf's results where GLSL's pow is undefined: x < 0 with an integral exponent (odd ones
// negate), NaN for x < 0 otherwise, 1 for exponent 0 (0 ^ 0 too)
vec4 powf4(vec4 x, vec4 e)
{
    const vec4 r = pow(abs(x), e);
    const bvec4 integral = equal(e, floor(e));
    const vec4 signed_r = mix(r, -r, equal(mod(e, 2.0), vec4(1.0)));
    const vec4 neg = mix(vec4(uintBitsToFloat(0x7fc00000u)), signed_r, integral);
    return mix(mix(r, neg, lessThan(x, vec4(0.0))), vec4(1.0), equal(e, vec4(0.0)));
}

void main()
{
    // Linear index over a 2-D grid: dispatches of more than 65535 groups go along y too.
    const int gi = int(gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x
                       + gl_GlobalInvocationID.x);
    if (gi >= p.size)
        return;
    const vec4 v = vec4(buffer_ld4(bottom_blob_data, gi));
    vec4 r;
    if (op == 0)
        r = tanh4(v);
    else if (op == 1)
        r = abs(v);
    else if (op == 2)
        r = mix(v, p.a * (exp(v) - 1.0), lessThan(v, vec4(0.0)));
    else if (op == 3)
        r = mix(v * p.b, (exp(v) - 1.0) * p.a, lessThan(v, vec4(0.0)));
    else if (op == 4)
        r = v * tanh4(softplus4(v));
    else if (op == 5)
        r = log(exp(v) + 1.0);  // as ncnn: inf once exp overflows
    else if (op == 6)
        r = 0.5 * v * (1.0 + erf4(v * 0.70710678));
    else if (op == 7)
        r = 0.5 * v * (1.0 + tanh4(0.79788452 * (v + 0.044715 * v * v * v)));
    else if (op == 8)
    {
        const vec4 t = p.c + v * p.b;
        r = p.a == -1.0 ? exp(t) : powf4(vec4(p.a), t);
    }
    else if (op == 9)
    {
        const vec4 t = log(p.c + v * p.b);
        r = p.a == -1.0 ? t : t / log(p.a);
    }
    else if (op == 10)
        r = powf4(p.c + v * p.b, vec4(p.a));
    else if (op == 11)
        r = erf4(v);
    else
        r = mix(vec4(0.0), vec4(1.0), greaterThan(v, vec4(p.a)));
    buffer_st4(top_blob_data, gi, afpvec4(r));
}
