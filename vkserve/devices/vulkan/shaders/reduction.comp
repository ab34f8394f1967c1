#version 450
// Reduction: one work group of 64 per output element (group index gl_WorkGroupID.y *
// gl_NumWorkGroups.x + gl_WorkGroupID.x; a whole work group past the end returns together, so
// no barrier is skipped by part of a group). The input is seen as kept axes x reduced axes, each
// up to 4 (sizes and element strides, padded in front with size 1): output element o is the
// C-order index over the kept axes, the 64 invocations stride over the `rcount` reduced
// positions, and a shared-memory tree combines their partial results (softmax.comp's pattern).
// op (ncnn's ids): 0 sum, 1 asum, 2 sumsq, 3 mean, 4 max, 5 min, 6 prod, 7 l1, 8 l2, 9 logsum,
// 10 logsumexp; mean divides by rcount, l2 takes the sqrt, logsum / logsumexp the log, and the
// result is multiplied by coeff. Accumulation is float in every mode.
layout (local_size_x = 64) in;

layout (constant_id = 0) const int op = 0;

layout (binding = 0) readonly buffer bottom_blob { sfp bottom_blob_data[]; };
layout (binding = 1) buffer top_blob { sfp top_blob_data[]; };

layout (push_constant) uniform parameter
{
    int count;
    int rcount;
    int ks0; int ks1; int ks2; int ks3;
    int kt0; int kt1; int kt2; int kt3;
    int rs0; int rs1; int rs2; int rs3;
    int rt0; int rt1; int rt2; int rt3;
    float coeff;
} p;

shared float partial[64];

float identity()
{
    if (op == 4)
        return uintBitsToFloat(0xff800000u);  // -inf
    if (op == 5)
        return uintBitsToFloat(0x7f800000u);  // +inf
    if (op == 6)
        return 1.0;
    return 0.0;
}

float combine(float a, float b)
{
    if (op == 4)
        return max(a, b);
    if (op == 5)
        return min(a, b);
    if (op == 6)
        return a * b;
    return a + b;
}

float term(float x)
{
    if (op == 1 || op == 7)
        return abs(x);
    if (op == 2 || op == 8)
        return x * x;
    if (op == 10)
        return exp(x);
    return x;
}

void main()
{
    const int g = int(gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x);
    if (g >= p.count)
        return;
    const int lid = int(gl_LocalInvocationID.x);

    int o = g;
    const int k3 = o % p.ks3; o /= p.ks3;
    const int k2 = o % p.ks2; o /= p.ks2;
    const int k1 = o % p.ks1; o /= p.ks1;
    const int base = o * p.kt0 + k1 * p.kt1 + k2 * p.kt2 + k3 * p.kt3;

    float acc = identity();
    for (int r = lid; r < p.rcount; r += 64)
    {
        int q = r;
        const int r3 = q % p.rs3; q /= p.rs3;
        const int r2 = q % p.rs2; q /= p.rs2;
        const int r1 = q % p.rs1; q /= p.rs1;
        const int i = base + q * p.rt0 + r1 * p.rt1 + r2 * p.rt2 + r3 * p.rt3;
        acc = combine(acc, term(float(buffer_ld1(bottom_blob_data, i))));
    }

    partial[lid] = acc;
    barrier();
    for (int st = 32; st > 0; st >>= 1)
    {
        if (lid < st)
            partial[lid] = combine(partial[lid], partial[lid + st]);
        barrier();
    }
    if (lid == 0)
    {
        float y = partial[0];
        if (op == 3)
            y = y / float(p.rcount);
        else if (op == 8)
            y = sqrt(y);
        else if (op == 9 || op == 10)
            y = log(y);
        buffer_st1(top_blob_data, g, afp(y * p.coeff));
    }
}
