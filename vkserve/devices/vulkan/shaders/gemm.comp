#version 450
// Gemm / MatMul: top = alpha * (beta * C + A @ B), tiled in shared memory with an in-work-group
// split of K (the scheme of conv_gemm.comp, with A and B read through strides).
//
// Operands are read through strides, so transA / transB / output_transpose and C's broadcasts
// (stride 0) need no copies:
//   A(i, k) = a[a0 + i * a_si + k * a_sk], B(k, j) = b[b0 + k * b_sk + j * b_sn],
//   C(i, j) = c[i * c_si + j * c_sj], top(i, j) -> top[z * o_b + i * o_si + j * o_sj],
// with z = gl_WorkGroupID.z the output batch (MatMul's broadcast batches, attention's heads),
// split into z1 = z / batch_inner and z2 = z % batch_inner: a0 = z1 * a_b1 + z2 * a_b2 and
// b0 = z1 * b_b1 + z2 * b_b2 (0 strides where a side broadcasts).
//
// One work group of 256 invocations computes a BM x BN tile of one batch (gl_WorkGroupID =
// (column tile, row tile, batch)). It is KS slices of BM * BN / 16 invocations, each
// invocation of a slice a 4 x 4 block (4 rows x 4 columns) of the tile: BM * BN * KS = 4096.
// Each step of the K loop takes KB = BK * KS values of k: the whole work group stages rows
// [k0, k0 + KB) of A (as [k][BM]) and B (as [k][BN]) into shared memory (the next step's
// values are loaded into registers while this step computes), slice s multiplies rows
// [s * BK, (s + 1) * BK) into its accumulators; at the end the slices' tiles are added through
// shared memory. Rows and columns past M / N and k past K are staged as zeros (their loads
// read element 0), so any M, N, K work; only in-range outputs are stored.
//
// Staging order follows the operand's unit stride so that the loads coalesce: with
// A_KFAST (a_sk == 1) 8 consecutive invocations read 8 consecutive k of one row (a 32-byte
// sector; with the shared tile's row padding their stores hit 32 distinct banks), otherwise
// consecutive invocations read consecutive rows i. The same for B with B_KFAST (b_sk == 1).
// Sums are float in every mode. With residual = 1, residual_blob (the output's layout) is added
// to every output value (a following residual sum folded in, engine.fusion), then the
// activation (activate.h: a following activation layer folded in).
#extension GL_EXT_control_flow_attributes : require
layout (local_size_x = 256) in;

layout (constant_id = 0) const int has_c = 0;
// tile shape (never 0; the layer picks it per shape, see layers/matmul.py)
layout (constant_id = 1) const int BM = 64;       // 16, 32 or 64
layout (constant_id = 2) const int BN = 64;       // 16, 32 or 64
layout (constant_id = 3) const int KS = 1;        // 4096 / (BM * BN)
layout (constant_id = 4) const int BK = 16;       // KS * BK % 8 == 0, BK * 16 % BM == BK * 16 % BN == 0
layout (constant_id = 5) const int A_KFAST = 1;   // a_sk == 1
layout (constant_id = 6) const int B_KFAST = 1;   // b_sk == 1
layout (constant_id = 7) const int residual = 0;
layout (constant_id = 8) const int activation_type = 0;
layout (constant_id = 9) const float activation_param_0 = 0;
layout (constant_id = 10) const float activation_param_1 = 0;

layout (binding = 0) readonly buffer a_blob { sfp a_data[]; };
layout (binding = 1) readonly buffer b_blob { sfp b_data[]; };
layout (binding = 2) readonly buffer c_blob { sfp c_data[]; };
layout (binding = 3) buffer top_blob { sfp top_blob_data[]; };
// with residual = 0 another blob of the layer is bound here, never read
layout (binding = 4) readonly buffer residual_blob { sfp residual_data[]; };

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

// 16 KiB: the A and B tiles ([KB][BM / 4 + 1] then [KB][BN / 4 + 1]: rows padded by one vec4),
// and at the end the slices' output tiles ([KS][BM][BN / 4]) for the split-K sum.
shared vec4 smem[1024];

const int TS = BM * BN / 16;          // invocations per slice
const int KB = BK * KS;               // rows of k staged per step
const int AR = BM / 4 + 1;            // vec4 per staged row of A
const int BR = BN / 4 + 1;            // vec4 per staged row of B
const int B_OFF = KB * AR;
const int A_PER = KB * BM / 256;      // values of A staged per invocation and step (<= 8)
const int B_PER = KB * BN / 256;      // values of B staged per invocation and step (<= 8)

// Element r of an invocation's share of a KB x ROWS tile: (k, row) of e = lid + r * 256.
// k-fast: 8 k of one row, then the next rows, then the next 8 k; else rows fastest.
ivec2 staged(int lid, int r, int ROWS, int kfast)
{
    const int e = lid + r * 256;
    if (kfast == 1)
    {
        const int rest = e / 8;
        const int row = rest % ROWS;
        return ivec2((rest / ROWS) * 8 + e % 8, row);
    }
    return ivec2(e / ROWS, e % ROWS);
}

#include "activate.h"

// top value (m, n) at index `at` from its sum: C, beta, alpha, the residual, the activation
void store_output(int at, int m, int n, float v)
{
    if (has_c == 1)
        v += float(buffer_ld1(c_data, m * p.c_si + n * p.c_sj)) * p.beta;
    v *= p.alpha;
    if (residual == 1)
        v += float(buffer_ld1(residual_data, at));
    buffer_st1(top_blob_data, at, activate(v));
}

void main()
{
    const int lid = int(gl_LocalInvocationIndex);
    const int slice = lid / TS;
    const int t = lid - slice * TS;
    const int z = int(gl_WorkGroupID.z);
    const int m0 = int(gl_WorkGroupID.y) * BM;
    const int n0 = int(gl_WorkGroupID.x) * BN;
    const int M = p.M;
    const int N = p.N;
    const int K = p.K;
    const int z1 = z / p.batch_inner;
    const int z2 = z - z1 * p.batch_inner;

    // staging: per value r, the offset of A(i, kk) / B(kk, j) (kk: its row of the step), the
    // number of steps' k0 for which it is in range (k0 < lim: 0 when i / j is out of range)
    // and its place in shared memory
    int a_off[8];
    int a_lim[8];
    int a_st[8];
    {
        const int a0 = z1 * p.a_b1 + z2 * p.a_b2;
        [[unroll]] for (int r = 0; r < A_PER; r++)
        {
            const ivec2 e = staged(lid, r, BM, A_KFAST);
            const int i = m0 + e.y;
            a_off[r] = a0 + i * p.a_si + e.x * p.a_sk;
            a_lim[r] = i < M ? K - e.x : 0;
            a_st[r] = e.x * AR * 4 + e.y;
        }
    }
    int b_off[8];
    int b_lim[8];
    int b_st[8];
    {
        const int b0 = z1 * p.b_b1 + z2 * p.b_b2;
        [[unroll]] for (int r = 0; r < B_PER; r++)
        {
            const ivec2 e = staged(lid, r, BN, B_KFAST);
            const int j = n0 + e.y;
            b_off[r] = b0 + j * p.b_sn + e.x * p.b_sk;
            b_lim[r] = j < N ? K - e.x : 0;
            b_st[r] = B_OFF * 4 + e.x * BR * 4 + e.y;
        }
    }

    // this invocation's 4 x 4 block: rows ty * 4 + i, columns tx * 4 + j
    const int tx = t % (BN / 4);
    const int ty = t / (BN / 4);
    const int a_rd = slice * BK * AR + ty;
    const int b_rd = B_OFF + slice * BK * BR + tx;

    float ra[8];
    float rb[8];
    vec4 acc0 = vec4(0.0);  // acc<j>[i]: row ty * 4 + i, column tx * 4 + j
    vec4 acc1 = vec4(0.0);
    vec4 acc2 = vec4(0.0);
    vec4 acc3 = vec4(0.0);

    // the first step's values; later steps load theirs during the previous step's arithmetic
    // (branch-free: out-of-range values load element 0 and are replaced by 0)
    [[unroll]] for (int r = 0; r < A_PER; r++)
    {
        const bool ok = 0 < a_lim[r];
        const float v = float(buffer_ld1(a_data, ok ? a_off[r] : 0));
        ra[r] = ok ? v : 0.0;
    }
    [[unroll]] for (int r = 0; r < B_PER; r++)
    {
        const bool ok = 0 < b_lim[r];
        const float v = float(buffer_ld1(b_data, ok ? b_off[r] : 0));
        rb[r] = ok ? v : 0.0;
    }

    for (int k0 = 0; k0 < K; k0 += KB)
    {
        [[unroll]] for (int r = 0; r < A_PER; r++)
            smem[a_st[r] >> 2][a_st[r] & 3] = ra[r];
        [[unroll]] for (int r = 0; r < B_PER; r++)
            smem[b_st[r] >> 2][b_st[r] & 3] = rb[r];
        barrier();

        const int k1 = k0 + KB;
        if (k1 < K)
        {
            const int ao = k1 * p.a_sk;
            [[unroll]] for (int r = 0; r < A_PER; r++)
            {
                const bool ok = k1 < a_lim[r];
                const float v = float(buffer_ld1(a_data, ok ? a_off[r] + ao : 0));
                ra[r] = ok ? v : 0.0;
            }
            const int bo = k1 * p.b_sk;
            [[unroll]] for (int r = 0; r < B_PER; r++)
            {
                const bool ok = k1 < b_lim[r];
                const float v = float(buffer_ld1(b_data, ok ? b_off[r] + bo : 0));
                rb[r] = ok ? v : 0.0;
            }
        }

        [[unroll]] for (int kk = 0; kk < BK; kk++)
        {
            const vec4 a = smem[a_rd + kk * AR];
            const vec4 b = smem[b_rd + kk * BR];
            acc0 += a * b.x;
            acc1 += a * b.y;
            acc2 += a * b.z;
            acc3 += a * b.w;
        }
        barrier();
    }

    const int ob = z * p.o_b;
    if (KS == 1)
    {
        [[unroll]] for (int i = 0; i < 4; i++)
        {
            const int m = m0 + ty * 4 + i;
            if (m < M)
            {
                const vec4 s = vec4(acc0[i], acc1[i], acc2[i], acc3[i]);
                [[unroll]] for (int j = 0; j < 4; j++)
                {
                    const int n = n0 + tx * 4 + j;
                    if (n < N)
                    {
                        store_output(ob + m * p.o_si + n * p.o_sj, m, n, s[j]);
                    }
                }
            }
        }
        return;
    }

    // split K: every slice's tile to shared memory ([slice][row][column / 4]), then the work
    // group adds them up, one vec4 of 4 columns per invocation and pass
    [[unroll]] for (int i = 0; i < 4; i++)
        smem[(slice * BM + ty * 4 + i) * (BN / 4) + tx] = vec4(acc0[i], acc1[i], acc2[i], acc3[i]);
    barrier();
    for (int e = lid; e < BM * BN / 4; e += 256)
    {
        vec4 s = smem[e];
        for (int q = 1; q < KS; q++)
            s += smem[q * (BM * BN / 4) + e];
        const int ml = e / (BN / 4);
        const int m = m0 + ml;
        if (m < M)
        {
            const int nb = n0 + (e - ml * (BN / 4)) * 4;
            [[unroll]] for (int j = 0; j < 4; j++)
            {
                const int n = nb + j;
                if (n < N)
                {
                    store_output(ob + m * p.o_si + n * p.o_sj, m, n, s[j]);
                }
            }
        }
    }
}
