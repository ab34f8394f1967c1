#version 450
// BinaryOp out = op(a, b), all ncnn op types (the r* ones swap the operands), computed in
// float in every mode. Each invocation writes one vec4 of the output (blobs are padded to
// whole vec4s; `size4` of them):
//   mode 0: a and b have the output's shape (elementwise: the output may take an input's bytes)
//   mode 1: b is the scalar p.b (binding 1 is then unused)
//   mode 2: ncnn broadcasting: the output's `size` elements form a 4-D shape (d0, d1, d2, d3),
//           d0 implied; a and b are read through their strides (0 along broadcast axes)
layout (constant_id = 0) const int op_type = 0;
layout (constant_id = 1) const int mode = 0;

layout (binding = 0) readonly buffer a_blob { sfpvec4 a_blob_data[]; };
layout (binding = 1) readonly buffer b_blob { sfpvec4 b_blob_data[]; };
layout (binding = 2) buffer top_blob { sfpvec4 top_blob_data[]; };

layout (push_constant) uniform parameter
{
    int size4;
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
    float b;
} p;

// fmod, floor_divide and remainder as ncnn's x86 kernels: from the float quotient
vec4 binary(vec4 x, vec4 y)
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
    if (op_type == 11) return atan(y, x);
    if (op_type == 12) return x - trunc(x / y) * y;
    if (op_type == 13) return y - trunc(y / x) * x;
    if (op_type == 14) return max(x, y) + log(1.0 + exp(min(x, y) - max(x, y)));
    if (op_type == 15) return floor(x / y);
    if (op_type == 16) return floor(y / x);
    if (op_type == 17) return x - roundEven(x / y) * y;
    return y - roundEven(y / x) * x;
}

// element i of a vec4-padded blob
float element(int which, int i)
{
    const afpvec4 v = which == 0 ? buffer_ld4(a_blob_data, i >> 2) : buffer_ld4(b_blob_data, i >> 2);
    return float(v[i & 3]);
}

void main()
{
    // Linear index over a 2-D grid: dispatches of more than 65535 groups go along y too.
    const int gi = int(gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x
                       + gl_GlobalInvocationID.x);
    if (gi >= p.size4)
        return;
    vec4 x;
    vec4 y;
    if (mode == 2)
    {
        for (int lane = 0; lane < 4; lane++)
        {
            int t = min(gi * 4 + lane, p.size - 1);  // padding lanes: any valid element
            const int x3 = t % p.d3;
            t /= p.d3;
            const int x2 = t % p.d2;
            t /= p.d2;
            const int x1 = t % p.d1;
            const int x0 = t / p.d1;
            x[lane] = element(0, x0 * p.as0 + x1 * p.as1 + x2 * p.as2 + x3 * p.as3);
            y[lane] = element(1, x0 * p.bs0 + x1 * p.bs1 + x2 * p.bs2 + x3 * p.bs3);
        }
    }
    else
    {
        x = vec4(buffer_ld4(a_blob_data, gi));
        y = mode == 1 ? vec4(p.b) : vec4(buffer_ld4(b_blob_data, gi));
    }
    buffer_st4(top_blob_data, gi, afpvec4(binary(x, y)));
}
