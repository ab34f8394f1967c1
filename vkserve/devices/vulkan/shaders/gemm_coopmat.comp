#version 450
// Gemm / MatMul on the tensor cores: top = alpha * (beta * C + A @ B) with VK_KHR_cooperative_matrix
// products of 16 x 16 x 16 fp16 tiles into fp32 accumulators. The operands and the output are
// read and written through gemm.comp's strides and batches (same push constants), so every
// layer that dispatches gemm.comp may dispatch this one instead; used in the fp16 storage modes
// on devices with 32-wide subgroups that offer the fp16 -> fp32 product (layers/matmul.py).
//
//   A(i, k) = a[a0 + i * a_si + k * a_sk], B(k, j) = b[b0 + k * b_sk + j * b_sn],
//   C(i, j) = c[i * c_si + j * c_sj], top(i, j) -> top[z * o_b + i * o_si + j * o_sj],
// z = gl_WorkGroupID.z the batch, z1 = z / batch_inner and z2 = z % batch_inner, a0 = z1 * a_b1
// + z2 * a_b2, b0 = z1 * b_b1 + z2 * b_b2.
//
// A work group is 8 subgroups of 32 invocations in a 2 x 4 grid over a BM x BN tile of the
// output (BM = 32 * FM rows, BN = 64 * FN columns); each subgroup owns FM x FN accumulators of
// 16 x 16. Each step stages BK (32 or 64) values of k: A row-major and B column-major in shared
// memory (k contiguous in both), double-buffered with one barrier per step; the next step's values
// are read into registers while this step multiplies. Staging follows each operand's unit
// stride so that neighbouring invocations read neighbouring addresses (A_KFAST: BK / 4
// invocations read a step's BK consecutive k of one row, else consecutive rows; B_KFAST
// likewise for columns).
// Values past M, N or K are staged as zeros (their loads read element 0), so any sizes work;
// only in-range outputs are stored, in the order of the output's unit stride (O_JFAST).
//
// Split K (a Gemm with few output tiles and a long K): the grid's z is batches x KSPLIT and
// each work group sums SPLIT_STEPS steps into fp32 partials (partial[split][z][MPAD][NPAD], or
// [NPAD][MPAD] where the output's rows are its unit stride, stored straight from the
// accumulators); a second dispatch of this shader with REDUCE = 1 adds them in split order and
// applies C, beta and alpha, one output per invocation. With residual = 1, residual_blob (the
// output's layout) is added to every output value (a following residual sum folded in,
// engine.fusion), then the activation (activate.h).
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_control_flow_attributes : require
layout (local_size_x = 256) in;

layout (constant_id = 0) const int has_c = 0;
layout (constant_id = 1) const int FM = 1;        // 16 x 16 fragments per subgroup along M: 1, 2
layout (constant_id = 2) const int FN = 1;        // along N: 1, 2
layout (constant_id = 3) const int A_KFAST = 1;   // a_sk == 1
layout (constant_id = 4) const int B_KFAST = 1;   // b_sk == 1
layout (constant_id = 5) const int O_JFAST = 1;   // o_sj == 1
layout (constant_id = 6) const int KSPLIT = 1;    // work groups along K
layout (constant_id = 7) const int SPLIT_STEPS = 1;  // steps of BK per split (KSPLIT > 1)
layout (constant_id = 8) const int MPAD = 0;      // rows of a partial: M rounded up to BM
layout (constant_id = 9) const int NPAD = 0;      // its columns: N rounded up to BN
layout (constant_id = 10) const int REDUCE = 0;   // 1: the split-K pass adding the partials
layout (constant_id = 11) const int residual = 0;
layout (constant_id = 12) const int activation_type = 0;
layout (constant_id = 13) const float activation_param_0 = 0;
layout (constant_id = 14) const float activation_param_1 = 0;
layout (constant_id = 15) const int BK = 32;      // values of k per step: 32, 64

layout (binding = 0) readonly buffer a_blob { sfp a_data[]; };
layout (binding = 1) readonly buffer b_blob { sfp b_data[]; };
layout (binding = 2) readonly buffer c_blob { sfp c_data[]; };
layout (binding = 3) buffer top_blob { sfp top_blob_data[]; };
// split K's fp32 partials (with KSPLIT = 1 another blob is bound here, never read)
layout (binding = 4) buffer partial_blob { float partial_data[]; };
// with residual = 0 another blob of the layer is bound here, never read
layout (binding = 5) readonly buffer residual_blob { sfp residual_data[]; };

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

const int BM = 32 * FM;
const int BN = 64 * FN;
const int S4 = BK / 4 + 2;             // row (A) / column (B) stride in f16vec4: two past a
                                       // step's, so that 16-byte pieces of neighbouring rows
                                       // change banks
const int A_PER = BM * (BK / 4) / 256; // 4 values of k of one row of A, per invocation and step (FM * BK / 32)
const int B_PER = BN * (BK / 8) / 256; // 8 values of k of one column of B, per invocation and step (FN * BK / 32)

shared f16vec4 tile_a[2 * BM * S4];
shared f16vec4 tile_b[2 * BN * S4];
shared float tile_c[8 * 256];          // one 16 x 16 accumulator per subgroup, for the epilogue

// per invocation, fixed for the work group's tile (set once by main)
int a_at[A_PER];                       // A(row, 0); -1: row past M
int a_kq[A_PER];
int a_st[A_PER];                       // its place in tile_a (one buffer)
int b_at[B_PER];                       // B(0, column); -1: column past N
int b_ko[B_PER];
int b_st[B_PER];                       // its place in tile_b (one buffer)
f16vec4 ra[A_PER];                     // the next step, on its way from memory to shared
f16vec4 rb[B_PER * 2];

float16_t a_value(int j, int k)
{
    const bool ok = a_at[j] >= 0 && k < p.K;
    const float v = float(buffer_ld1(a_data, ok ? a_at[j] + (A_KFAST == 1 ? k : k * p.a_sk) : 0));
    return float16_t(ok ? v : 0.0);
}

float16_t b_value(int j, int k)
{
    const bool ok = b_at[j] >= 0 && k < p.K;
    const float v = float(buffer_ld1(b_data, ok ? b_at[j] + (B_KFAST == 1 ? k : k * p.b_sk) : 0));
    return float16_t(ok ? v : 0.0);
}

// registers <- the step of K starting at k0
void load_step(int k0)
{
    [[unroll]] for (int j = 0; j < A_PER; j++)
    {
        const int k = k0 + a_kq[j] * 4;
        ra[j] = f16vec4(a_value(j, k), a_value(j, k + 1), a_value(j, k + 2), a_value(j, k + 3));
    }
    [[unroll]] for (int j = 0; j < B_PER; j++)
    {
        const int k = k0 + b_ko[j] * 8;
        rb[2 * j] = f16vec4(b_value(j, k), b_value(j, k + 1), b_value(j, k + 2), b_value(j, k + 3));
        rb[2 * j + 1] = f16vec4(b_value(j, k + 4), b_value(j, k + 5), b_value(j, k + 6), b_value(j, k + 7));
    }
}

// shared buffer b <- the registers
void store_step(int b)
{
    [[unroll]] for (int j = 0; j < A_PER; j++)
        tile_a[b * BM * S4 + a_st[j]] = ra[j];
    [[unroll]] for (int j = 0; j < B_PER; j++)
    {
        tile_b[b * BN * S4 + b_st[j]] = rb[2 * j];
        tile_b[b * BN * S4 + b_st[j] + 1] = rb[2 * j + 1];
    }
}

#include "activate.h"

// top(m, n) of batch z from its sum: C, beta, alpha, the residual, the activation
void store_output(int z, int m, int n, float v)
{
    if (has_c == 1)
        v += float(buffer_ld1(c_data, m * p.c_si + n * p.c_sj)) * p.beta;
    v *= p.alpha;
    const int at = z * p.o_b + m * p.o_si + n * p.o_sj;
    if (residual == 1)
        v += float(buffer_ld1(residual_data, at));
    buffer_st1(top_blob_data, at, activate(v));
}

// The split-K pass: output (z, m, n) = the partials' sum, in split order. Neighbouring
// invocations take neighbouring outputs along the output's unit stride (O_JFAST: n, else m),
// and the partials are laid out the same way (main), so reads and writes both coalesce.
void reduce_partials()
{
    const int n = int(O_JFAST == 1 ? gl_GlobalInvocationID.x : gl_GlobalInvocationID.y);
    const int m = int(O_JFAST == 1 ? gl_GlobalInvocationID.y : gl_GlobalInvocationID.x);
    const int z = int(gl_GlobalInvocationID.z);
    if (n >= p.N || m >= p.M)
        return;
    const int plane = MPAD * NPAD;
    const int batches = int(gl_NumWorkGroups.z);
    int at = z * plane + (O_JFAST == 1 ? m * NPAD + n : n * MPAD + m);
    float sum = 0.0;
    for (int s = 0; s < KSPLIT; s++)
    {
        sum += partial_data[at];
        at += batches * plane;
    }
    store_output(z, m, n, sum);
}

void main()
{
    if (REDUCE == 1)
    {
        reduce_partials();
        return;
    }
    const int lid = int(gl_LocalInvocationIndex);
    const int sg = int(gl_SubgroupID);
    const int z = int(gl_WorkGroupID.z) / KSPLIT;
    const int split = int(gl_WorkGroupID.z) - z * KSPLIT;
    const int m0 = int(gl_WorkGroupID.y) * BM;
    const int n0 = int(gl_WorkGroupID.x) * BN;
    const int z1 = z / p.batch_inner;
    const int z2 = z - z1 * p.batch_inner;
    const int a0 = z1 * p.a_b1 + z2 * p.a_b2;
    const int b0 = z1 * p.b_b1 + z2 * p.b_b2;

    [[unroll]] for (int j = 0; j < A_PER; j++)
    {
        const int slot = lid + 256 * j;
        const int row = A_KFAST == 1 ? slot / (BK / 4) : slot % BM;
        a_kq[j] = A_KFAST == 1 ? slot % (BK / 4) : slot / BM;
        a_at[j] = m0 + row < p.M ? a0 + (m0 + row) * p.a_si : -1;
        a_st[j] = row * S4 + a_kq[j];
    }
    [[unroll]] for (int j = 0; j < B_PER; j++)
    {
        const int slot = lid + 256 * j;
        const int col = B_KFAST == 1 ? slot / (BK / 8) : slot % BN;
        b_ko[j] = B_KFAST == 1 ? slot % (BK / 8) : slot / BN;
        b_at[j] = n0 + col < p.N ? b0 + (n0 + col) * p.b_sn : -1;
        b_st[j] = col * S4 + b_ko[j] * 2;
    }

    // this subgroup's fragments: rows sm + 16 i of the tile, columns sn + 16 j
    const int sm = (sg / 4) * FM * 16;
    const int sn = (sg % 4) * FN * 16;

    coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator> acc[FM * FN];
    [[unroll]] for (int i = 0; i < FM * FN; i++)
        acc[i] = coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>(0.0);

    const int all_steps = (p.K + BK - 1) / BK;
    const int first = KSPLIT > 1 ? split * SPLIT_STEPS : 0;
    const int steps = KSPLIT > 1 ? min(SPLIT_STEPS, all_steps - first) : all_steps;
    load_step(first * BK);
    store_step(0);
    barrier();
    for (int s = 0; s < steps; s++)
    {
        const int cur = s & 1;
        if (s + 1 < steps)
            load_step((first + s + 1) * BK);
        [[unroll]] for (int kk = 0; kk < BK / 4; kk += 4)
        {
            coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB> b[FN];
            [[unroll]] for (int j = 0; j < FN; j++)
                coopMatLoad(b[j], tile_b, uint(cur * BN * S4 + (sn + 16 * j) * S4 + kk), uint(S4),
                            gl_CooperativeMatrixLayoutColumnMajor);
            [[unroll]] for (int i = 0; i < FM; i++)
            {
                coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> a;
                coopMatLoad(a, tile_a, uint(cur * BM * S4 + (sm + 16 * i) * S4 + kk), uint(S4),
                            gl_CooperativeMatrixLayoutRowMajor);
                [[unroll]] for (int j = 0; j < FN; j++)
                    acc[i * FN + j] = coopMatMulAdd(a, b[j], acc[i * FN + j]);
            }
        }
        if (s + 1 < steps)
            store_step(cur ^ 1);
        barrier();
    }

    if (KSPLIT > 1)
    {
        // partials: every tile lies inside [MPAD] x [NPAD], so no bounds checks; row-major
        // (partial[split][z][MPAD][NPAD]) when the output's columns are its unit stride, else
        // column-major ([split][z][NPAD][MPAD]), as the reduce pass walks the output
        const int batches = int(gl_NumWorkGroups.z) / KSPLIT;
        const int plane = (split * batches + z) * MPAD * NPAD;
        [[unroll]] for (int i = 0; i < FM; i++)
            [[unroll]] for (int j = 0; j < FN; j++)
            {
                const int m = m0 + sm + 16 * i;
                const int n = n0 + sn + 16 * j;
                if (O_JFAST == 1)
                    coopMatStore(acc[i * FN + j], partial_data, uint(plane + m * NPAD + n), uint(NPAD),
                                 gl_CooperativeMatrixLayoutRowMajor);
                else
                    coopMatStore(acc[i * FN + j], partial_data, uint(plane + n * MPAD + m), uint(MPAD),
                                 gl_CooperativeMatrixLayoutColumnMajor);
            }
        return;
    }

    // epilogue: each accumulator through shared memory, stored in the output's unit-stride
    // order (tile_c row-major when columns are contiguous in the output, else column-major)
    const int lane = int(gl_SubgroupInvocationID);
    const int lanes = int(gl_SubgroupSize);
    [[unroll]] for (int i = 0; i < FM; i++)
    {
        [[unroll]] for (int j = 0; j < FN; j++)
        {
            coopMatStore(acc[i * FN + j], tile_c, uint(sg * 256), 16u,
                         O_JFAST == 1 ? gl_CooperativeMatrixLayoutRowMajor : gl_CooperativeMatrixLayoutColumnMajor);
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            for (int e = lane; e < 256; e += lanes)
            {
                const int m = m0 + sm + 16 * i + (O_JFAST == 1 ? e / 16 : e % 16);
                const int n = n0 + sn + 16 * j + (O_JFAST == 1 ? e % 16 : e / 16);
                if (m < p.M && n < p.N)
                    store_output(z, m, n, tile_c[sg * 256 + e]);
            }
            subgroupMemoryBarrierShared();
            subgroupBarrier();
        }
    }
}
