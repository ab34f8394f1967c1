#version 450
// Gemm / MatMul: top = alpha * (A @ B + beta * C), one output element per invocation
// (gl_GlobalInvocationID.x = column j < N, .y = row i < M, .z = batch z of MatMul, split into
// z / batch_inner and z % batch_inner, each with its own A / B stride, 0 where it broadcasts;
// the output batches are contiguous, o_b apart). Operands are read through strides,
// so transA / transB / output_transpose and C's broadcasts (stride 0) need no copies:
//   A(i, k) = a[i * a_si + k * a_sk], B(k, j) = b[k * b_sk + j * b_sn],
//   C(i, j) = c[i * c_si + j * c_sj], top(i, j) -> top[i * o_si + j * o_sj].
// The sum is float in every mode (ncnn's order: beta * C first, then the products, then alpha).
layout (local_size_x = 8, local_size_y = 8) in;

layout (constant_id = 0) const int has_c = 0;

layout (binding = 0) readonly buffer a_blob { sfp a_data[]; };
layout (binding = 1) readonly buffer b_blob { sfp b_data[]; };
layout (binding = 2) readonly buffer c_blob { sfp c_data[]; };
layout (binding = 3) writeonly buffer top_blob { sfp top_blob_data[]; };

layout (push_constant) uniform parameter
{
    int M;
    int N;
    int K;
    int a_si;
    int a_sk;
    int b_sk;
    int b_sn;
    int c_si;
    int c_sj;
    int o_si;
    int o_sj;
    float alpha;
    float beta;
    int batch_inner;
    int a_b1;
    int a_b2;
    int b_b1;
    int b_b2;
    int o_b;
} p;

void main()
{
    const int j = int(gl_GlobalInvocationID.x);
    const int i = int(gl_GlobalInvocationID.y);
    const int z = int(gl_GlobalInvocationID.z);
    if (j >= p.N || i >= p.M)
        return;
    const int z1 = z / p.batch_inner;
    const int z2 = z % p.batch_inner;

    float sum = 0.0;
    if (has_c == 1)
        sum = float(buffer_ld1(c_data, i * p.c_si + j * p.c_sj)) * p.beta;

    int ai = z1 * p.a_b1 + z2 * p.a_b2 + i * p.a_si;
    int bi = z1 * p.b_b1 + z2 * p.b_b2 + j * p.b_sn;
    for (int k = 0; k < p.K; k++)
    {
        sum += float(buffer_ld1(a_data, ai)) * float(buffer_ld1(b_data, bi));
        ai += p.a_sk;
        bi += p.b_sk;
    }
    buffer_st1(top_blob_data, z * p.o_b + i * p.o_si + j * p.o_sj, afp(sum * p.alpha));
}
