#version 450
// Elementwise unary ops over `size` vec4 elements (blobs are padded to whole vec4s), out of
// place; the executor may bind bottom and top to the same bytes (elementwise safe).
// op: 0 ReLU / leaky ReLU (a = slope), 1 Clip (a = min, b = max; max wins over min, as ncnn),
//     2 Sigmoid, 3 Swish, 4 HardSigmoid (a = alpha, b = beta), 5 HardSwish (a = alpha,
//     b = beta), 6 scale by a: in the arithmetic type.
//     7 + t: ncnn's UnaryOp op_type t (0 abs .. 27 log1p), computed in float in every mode.
layout (constant_id = 0) const int op = 0;

layout (binding = 0) readonly buffer bottom_blob { sfpvec4 bottom_blob_data[]; };
layout (binding = 1) buffer top_blob { sfpvec4 top_blob_data[]; };

layout (push_constant) uniform parameter
{
    int size;
    float a;
    float b;
} p;

// tanh without the inf / inf of (e^2x - 1) / (e^2x + 1) for large |x|
vec4 tanh4(vec4 x)
{
    const vec4 e = exp(-2.0 * abs(x));
    return sign(x) * (1.0 - e) / (1.0 + e);
}

// log(1 + x) without losing x when 1 + x rounds
vec4 log1p4(vec4 x)
{
    const vec4 u = 1.0 + x;
    return mix(log(u) * x / (u - 1.0), x, equal(u, vec4(1.0)));
}

vec4 unary(int t, vec4 x)
{
    if (t == 0) return abs(x);
    if (t == 1) return -x;
    if (t == 2) return floor(x);
    if (t == 3) return ceil(x);
    if (t == 4) return x * x;
    if (t == 5) return sqrt(x);
    if (t == 6) return 1.0 / sqrt(x);
    if (t == 7) return exp(x);
    if (t == 8) return log(x);
    if (t == 9) return sin(x);
    if (t == 10) return cos(x);
    if (t == 11) return tan(x);
    if (t == 12) return atan(x, sqrt((1.0 - x) * (1.0 + x)));  // GLSL's asin / acos are
    if (t == 13) return atan(sqrt((1.0 - x) * (1.0 + x)), x);  // ~3e-4 off on some drivers
    if (t == 14) return atan(x);
    if (t == 15) return 1.0 / x;
    if (t == 16) return tanh4(x);
    if (t == 17) return log(x) * 0.43429448190325176;
    if (t == 18) return roundEven(x);
    if (t == 19) return trunc(x);
    if (t == 20) return sign(x);
    if (t == 21) return mix(exp(x) - 1.0, x + 0.5 * x * x, lessThan(abs(x), vec4(1e-3)));
    if (t == 22) return 0.5 * (exp(x) - exp(-x));
    if (t == 23) return sign(x) * log(abs(x) + sqrt(x * x + 1.0));
    if (t == 24) return 0.5 * (exp(x) + exp(-x));
    if (t == 25) return log(x + sqrt(x * x - 1.0));
    if (t == 26) return 0.5 * (log1p4(x) - log1p4(-x));
    return log1p4(x);
}

void main()
{
    // Linear index over a 2-D grid: dispatches of more than 65535 groups go along y too.
    const int gi = int(gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x
                       + gl_GlobalInvocationID.x);
    if (gi >= p.size)
        return;
    if (op >= 7)
    {
        const vec4 x = vec4(buffer_ld4(bottom_blob_data, gi));
        buffer_st4(top_blob_data, gi, afpvec4(unary(op - 7, x)));
        return;
    }
    afpvec4 v = buffer_ld4(bottom_blob_data, gi);
    const afp a = afp(p.a);
    const afp b = afp(p.b);
    if (op == 0)
        v = mix(v * a, v, greaterThanEqual(v, afpvec4(0)));
    else if (op == 1)
        v = min(max(v, a), b);
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
