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
// 16 x 16. Each step stages BK (32 or 64) values of k of both operands in shared memory,
// double-buffered with one barrier per step. The PREFETCH steps after this one are on their way
// from memory into registers while it multiplies (one set of registers each, reused in turn):
// a step's few products take far less than a load's latency, so with one step in flight the
// work group waited on memory every step. Each operand is staged in its own memory order, so that an
// invocation reads 4 neighbouring values along the operand's unit stride and neighbouring
// invocations neighbouring quads: A row-major (A_KFAST, a_sk == 1) or column-major, B
// column-major (B_KFAST, b_sk == 1) or row-major; coopMatLoad reads either. Where the quads are
// whole and aligned (A_VEC / B_VEC: the unit-stride extent and every other stride multiples of
// 4) a quad is one 8-byte load, else four loads with their own bounds checks.
// Values past K are staged as zeros, so any sizes work; past M or N zeros too, or where quads
// are whole the last row's or column's values (load_step): only in-range outputs are stored,
// in the order of the output's unit stride (O_JFAST).
//
// Split K (a Gemm with few output tiles and a long K): the grid's z is batches x KSPLIT and
// each work group sums SPLIT_STEPS steps into fp32 partials (partial[split][z][MPAD][NPAD], or
// [NPAD][MPAD] where the output's rows are its unit stride, stored straight from the
// accumulators), then counts itself in its tile's counter (tile_count, zeroed by the Plan
// before every run); the tile's last work group to count adds the tile's partials in split
// order (whichever came last: the same sums every run) and stores the outputs. A second
// dispatch for the sums cost a launch and a barrier a product (~5 us on an H200). With
// residual = 1, residual_blob (the output's layout) is added to every output value (a following
// residual sum folded in, engine.fusion), then the activation (activate.h).
//
// With A_NORM = 1 each row of A is a LayerNorm's run, normalised as it is read (a LayerNorm
// before the product folded in, engine.fusion): A(i, k) = (x - mean_i) / sqrt(var_i + norm_eps)
// * gamma[k] + beta[k], rounded to fp16 as the LayerNorm's output was; the work group first
// sums its rows (row_statistics) into row_mean / row_rstd. Needs A_KFAST.
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
layout (constant_id = 10) const int residual = 0;
layout (constant_id = 11) const int activation_type = 0;
layout (constant_id = 12) const float activation_param_0 = 0;
layout (constant_id = 13) const float activation_param_1 = 0;
layout (constant_id = 14) const int BK = 32;      // values of k per step: 32, 64
layout (constant_id = 15) const int A_VEC = 0;    // A's quads whole and 8-byte aligned
layout (constant_id = 16) const int B_VEC = 0;    // B's likewise
layout (constant_id = 17) const int A_NORM = 0;   // A's rows normalised on the way in
layout (constant_id = 18) const float norm_eps = 0;
layout (constant_id = 19) const int PREFETCH = 1; // steps in flight in registers: 1..4

layout (binding = 0) readonly buffer a_blob { sfp a_data[]; };
layout (binding = 1) readonly buffer b_blob { sfp b_data[]; };
layout (binding = 0) readonly buffer a_blob4 { sfpvec4 a_data4[]; };  // the same, by quads
layout (binding = 1) readonly buffer b_blob4 { sfpvec4 b_data4[]; };
layout (binding = 2) readonly buffer c_blob { sfp c_data[]; };
layout (binding = 3) buffer top_blob { sfp top_blob_data[]; };
// split K's fp32 partials and the work groups of each tile that have stored theirs (with
// KSPLIT = 1 other blobs are bound here, never read); coherent: another work group reads them
layout (binding = 4) coherent buffer partial_blob { float partial_data[]; };
layout (binding = 4) coherent buffer partial_blob4 { vec4 partial_data4[]; };  // by quads
layout (binding = 8) coherent buffer count_blob { uint tile_count[]; };
// with residual = 0 another blob of the layer is bound here, never read
layout (binding = 5) readonly buffer residual_blob { sfp residual_data[]; };
// with A_NORM = 0 another blob of the layer is bound to both, never read
layout (binding = 6) readonly buffer gamma_blob { sfp gamma_data[]; };
layout (binding = 7) readonly buffer beta_blob { sfp beta_data[]; };
layout (binding = 6) readonly buffer gamma_blob4 { sfpvec4 gamma_data4[]; };  // by quads (A_VEC)
layout (binding = 7) readonly buffer beta_blob4 { sfpvec4 beta_data4[]; };

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
// Shared rows (or columns) are two f16vec4 longer than their data, so that 16-byte pieces of
// neighbouring rows change banks. A: BM rows of BK (A_KFAST) or BK rows of BM; B: BN columns of
// BK (B_KFAST) or BK rows of BN.
const int SA = A_KFAST * (BK / 4 + 2) + (1 - A_KFAST) * (BM / 4 + 2);
const int SB = B_KFAST * (BK / 4 + 2) + (1 - B_KFAST) * (BN / 4 + 2);
const int A_SIZE = A_KFAST * BM * SA + (1 - A_KFAST) * BK * SA;
const int B_SIZE = B_KFAST * BN * SB + (1 - B_KFAST) * BK * SB;
const int A_PER = BM * BK / 4 / 256;   // quads of A per invocation and step (FM * BK / 32)
const int B_PER = BN * BK / 4 / 256;   // of B (FN * BK / 16)
const int QUADS = BM * BN / 4 / 256;   // split K: quads of partials an invocation adds

shared f16vec4 tile_a[2 * A_SIZE];
shared f16vec4 tile_b[2 * B_SIZE];
shared float tile_c[8 * 256];          // one 16 x 16 accumulator per subgroup, for the epilogue
                                       // (A_NORM: first the row sums' partials)
shared float row_mean[BM];             // A_NORM: the tile's rows' statistics
shared float row_rstd[BM];
// split K: [0] = 1 where this work group adds the tile's partials. 16 bytes, not a lone
// word: the driver may place it before the tiles, and one 4-byte shared variable there
// misaligned the fragment loads (an H200 read every product wrong, K split or not)
shared uint last_of_tile[4];

// per invocation and quad, fixed for the work group's tile (set once by main): the quad's
// first row / column (m or n: past the end of M / N where it is), its k offset within a
// step, and its place in one shared buffer
int a_mn[A_PER];
int a_k[A_PER];
int a_st[A_PER];
int b_mn[B_PER];
int b_k[B_PER];
int b_st[B_PER];
f16vec4 ra[PREFETCH * A_PER];          // the next steps, on their way from memory to shared:
f16vec4 rb[PREFETCH * B_PER];          // step t in set t % PREFETCH

// 4 values of A from (m, k): along k (A_KFAST) or along m; zeros past M and K, or with A_VEC
// the clamped quad's values (load_step)
f16vec4 a_quad(int a0, int m, int k)
{
    const int dm = 1 - A_KFAST;
    const int dk = A_KFAST;
    if (A_VEC == 1)  // clamped, not checked: see load_step
        return f16vec4(buffer_ld4(a_data4, (a0 + min(m, p.M - 4 * dm - dk) * p.a_si + min(k, p.K - 4 * dk - dm) * p.a_sk) / 4));
    f16vec4 v;
    [[unroll]] for (int e = 0; e < 4; e++)
    {
        const int mm = m + e * dm;
        const int kk = k + e * dk;
        const bool ok = mm < p.M && kk < p.K;
        const float x = float(buffer_ld1(a_data, ok ? a0 + mm * p.a_si + kk * p.a_sk : 0));
        v[e] = float16_t(ok ? x : 0.0);
    }
    return v;
}

// 4 values of B from (k, n): along k (B_KFAST) or along n; zeros past K and N, or with B_VEC
// the clamped quad's values (load_step)
f16vec4 b_quad(int b0, int k, int n)
{
    const int dn = 1 - B_KFAST;
    const int dk = B_KFAST;
    if (B_VEC == 1)  // clamped, not checked: see load_step
        return f16vec4(buffer_ld4(b_data4, (b0 + min(k, p.K - 4 * dk - dn) * p.b_sk + min(n, p.N - 4 * dn - dk) * p.b_sn) / 4));
    f16vec4 v;
    [[unroll]] for (int e = 0; e < 4; e++)
    {
        const int nn = n + e * dn;
        const int kk = k + e * dk;
        const bool ok = nn < p.N && kk < p.K;
        const float x = float(buffer_ld1(b_data, ok ? b0 + kk * p.b_sk + nn * p.b_sn : 0));
        v[e] = float16_t(ok ? x : 0.0);
    }
    return v;
}

// A_NORM: a quad of row m (the tile's row r) from k, normalised; zeros stay zeros
f16vec4 normalised(f16vec4 v, int m, int r, int k)
{
    if (m >= p.M || k >= p.K)
        return v;
    const vec4 x = (vec4(v) - row_mean[r]) * row_rstd[r];
    if (A_VEC == 1)
        return f16vec4(x * vec4(buffer_ld4(gamma_data4, k / 4)) + vec4(buffer_ld4(beta_data4, k / 4)));
    vec4 y;
    [[unroll]] for (int e = 0; e < 4; e++)
    {
        const bool ok = k + e < p.K;  // a quad across the end of K
        const float g = float(buffer_ld1(gamma_data, ok ? k + e : 0));
        y[e] = ok ? x[e] * g + float(buffer_ld1(beta_data, ok ? k + e : 0)) : 0.0;
    }
    return f16vec4(y);
}

// A_NORM: the work group's BM rows' mean and 1 / sqrt(var + eps), 256 / BM invocations a row,
// in one pass of sums of (x - c) and (x - c)^2, c the row's first value (the shift keeps
// E[d^2] - E[d]^2 from cancelling where the mean is large against the spread)
void row_statistics(int a0, int m0, int lid)
{
    const int per = 256 / BM;
    const int r = lid / per;
    const int part = lid - r * per;
    const int at = a0 + (m0 + r) * p.a_si;
    const bool live = m0 + r < p.M;
    const float c = live ? float(buffer_ld1(a_data, at)) : 0.0;
    float s = 0.0;
    float s2 = 0.0;
    if (A_VEC == 1)
    {
        for (int k = part * 4; live && k < p.K; k += per * 4)
        {
            const vec4 d = vec4(buffer_ld4(a_data4, (at + k) / 4)) - c;
            s += d.x + d.y + d.z + d.w;
            s2 += dot(d, d);
        }
    }
    else
    {
        for (int k = part; live && k < p.K; k += per)
        {
            const float d = float(buffer_ld1(a_data, at + k)) - c;
            s += d;
            s2 += d * d;
        }
    }
    tile_c[lid] = s;
    tile_c[256 + lid] = s2;
    barrier();
    if (part == 0)
    {
        float t = 0.0;
        float t2 = 0.0;
        for (int q = 0; q < per; q++)
        {
            t += tile_c[lid + q];
            t2 += tile_c[256 + lid + q];
        }
        const float d = t / float(p.K);
        row_mean[r] = c + d;
        row_rstd[r] = 1.0 / sqrt(max(t2 / float(p.K) - d * d, 0.0) + norm_eps);
    }
    barrier();
}

// register set `set` <- the step of K starting at k0. Nothing here may use a loaded value: a
// select on one (a bounds check's zero) waits for the load then and there, and the steps in
// flight would be waited on one by one (H200: a 3136 x 384 x 1024 product 43.7 -> 31.1 us
// without the checks). So whole quads (A_VEC / B_VEC) load from clamped places instead, and
// store_step zeros those past K; past M or N they are the last row's or column's values,
// which reach only outputs that are never stored.
void load_step(int set, int a0, int b0, int k0)
{
    [[unroll]] for (int j = 0; j < A_PER; j++)
        ra[set * A_PER + j] = a_quad(a0, a_mn[j], k0 + a_k[j]);
    [[unroll]] for (int j = 0; j < B_PER; j++)
        rb[set * B_PER + j] = b_quad(b0, k0 + b_k[j], b_mn[j]);
}

// shared buffer b <- register set `set` (the step from k0), A's rows normalised (A_NORM) here,
// when the values have arrived anyway
void store_step(int set, int b, int k0, int m0)
{
    [[unroll]] for (int j = 0; j < A_PER; j++)
    {
        const int k = k0 + a_k[j];
        f16vec4 v = A_VEC == 1 && k >= p.K ? f16vec4(0.0) : ra[set * A_PER + j];
        tile_a[b * A_SIZE + a_st[j]] = A_NORM == 1 ? normalised(v, a_mn[j], a_mn[j] - m0, k) : v;
    }
    [[unroll]] for (int j = 0; j < B_PER; j++)
        tile_b[b * B_SIZE + b_st[j]] = B_VEC == 1 && k0 + b_k[j] >= p.K ? f16vec4(0.0) : rb[set * B_PER + j];
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

// Split K, the tile's last work group: every output (z, m, n) of the tile from its partials'
// sum, in split order. An invocation adds quads of 4 neighbours along the output's unit stride
// (O_JFAST: n, else m), neighbouring invocations neighbouring quads, as the partials are laid
// out (main): the loads coalesce, and all of a split's are in flight at once.
void add_partials(int z, int m0, int n0, int lid)
{
    const int plane = MPAD * NPAD;
    const int batches = int(gl_NumWorkGroups.z) / KSPLIT;
    int first[QUADS];                  // quad q's first output, in the tile's order
    vec4 sums[QUADS];
    [[unroll]] for (int q = 0; q < QUADS; q++)
    {
        first[q] = (lid + 256 * q) * 4;
        sums[q] = vec4(0.0);
    }
    for (int s = 0; s < KSPLIT; s++)
        [[unroll]] for (int q = 0; q < QUADS; q++)
        {
            const int m = m0 + (O_JFAST == 1 ? first[q] / BN : first[q] % BM);
            const int n = n0 + (O_JFAST == 1 ? first[q] % BN : first[q] / BM);
            sums[q] += partial_data4[((s * batches + z) * plane + (O_JFAST == 1 ? m * NPAD + n : n * MPAD + m)) / 4];
        }
    [[unroll]] for (int q = 0; q < QUADS; q++)
    {
        const int m = m0 + (O_JFAST == 1 ? first[q] / BN : first[q] % BM);
        const int n = n0 + (O_JFAST == 1 ? first[q] % BN : first[q] / BM);
        [[unroll]] for (int c = 0; c < 4; c++)
        {
            const int mm = m + (O_JFAST == 1 ? 0 : c);
            const int nn = n + (O_JFAST == 1 ? c : 0);
            if (mm < p.M && nn < p.N)
                store_output(z, mm, nn, sums[q][c]);
        }
    }
}

void main()
{
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

    // quad j of an invocation: slot lid + 256 j of the step's, neighbouring slots along the
    // operand's unit stride
    [[unroll]] for (int j = 0; j < A_PER; j++)
    {
        const int slot = lid + 256 * j;
        const int q = A_KFAST == 1 ? BK / 4 : BM / 4;  // quads per shared row
        const int row = slot / q;
        const int quad = slot % q;
        a_mn[j] = m0 + (A_KFAST == 1 ? row : quad * 4);
        a_k[j] = A_KFAST == 1 ? quad * 4 : row;
        a_st[j] = row * SA + quad;
    }
    [[unroll]] for (int j = 0; j < B_PER; j++)
    {
        const int slot = lid + 256 * j;
        const int q = B_KFAST == 1 ? BK / 4 : BN / 4;
        const int row = slot / q;
        const int quad = slot % q;
        b_mn[j] = n0 + (B_KFAST == 1 ? row : quad * 4);
        b_k[j] = B_KFAST == 1 ? quad * 4 : row;
        b_st[j] = row * SB + quad;
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
    if (A_NORM == 1)
        row_statistics(a0, m0, lid);
    load_step(0, a0, b0, first * BK);
    store_step(0, 0, first * BK, m0);
    [[unroll]] for (int t = 1; t <= PREFETCH; t++)
        if (t < steps)
            load_step(t % PREFETCH, a0, b0, (first + t) * BK);
    barrier();
    for (int s0 = 0; s0 < steps; s0 += PREFETCH)
    {
        [[unroll]] for (int u = 0; u < PREFETCH; u++)
        {
            const int s = s0 + u;
            if (s >= steps)
                break;
            const int cur = s & 1;
            [[unroll]] for (int kk = 0; kk < BK; kk += 16)
            {
                coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB> b[FN];
                [[unroll]] for (int j = 0; j < FN; j++)
                {
                    if (B_KFAST == 1)
                        coopMatLoad(b[j], tile_b, uint(cur * B_SIZE + (sn + 16 * j) * SB + kk / 4), uint(SB),
                                    gl_CooperativeMatrixLayoutColumnMajor);
                    else
                        coopMatLoad(b[j], tile_b, uint(cur * B_SIZE + kk * SB + (sn + 16 * j) / 4), uint(SB),
                                    gl_CooperativeMatrixLayoutRowMajor);
                }
                [[unroll]] for (int i = 0; i < FM; i++)
                {
                    coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> a;
                    if (A_KFAST == 1)
                        coopMatLoad(a, tile_a, uint(cur * A_SIZE + (sm + 16 * i) * SA + kk / 4), uint(SA),
                                    gl_CooperativeMatrixLayoutRowMajor);
                    else
                        coopMatLoad(a, tile_a, uint(cur * A_SIZE + kk * SA + (sm + 16 * i) / 4), uint(SA),
                                    gl_CooperativeMatrixLayoutColumnMajor);
                    [[unroll]] for (int j = 0; j < FN; j++)
                        acc[i * FN + j] = coopMatMulAdd(a, b[j], acc[i * FN + j]);
                }
            }
            // step s + 1 (in set (u + 1) % PREFETCH) to the other buffer, then that set
            // takes step s + 1 + PREFETCH
            const int next = (u + 1) % PREFETCH;
            if (s + 1 < steps)
            {
                store_step(next, cur ^ 1, (first + s + 1) * BK, m0);
                if (s + 1 + PREFETCH < steps)
                    load_step(next, a0, b0, (first + s + 1 + PREFETCH) * BK);
            }
            barrier();
        }
    }

    if (KSPLIT > 1)
    {
        // partials: every tile lies inside [MPAD] x [NPAD], so no bounds checks; row-major
        // (partial[split][z][MPAD][NPAD]) when the output's columns are its unit stride, else
        // column-major ([split][z][NPAD][MPAD]), as add_partials walks the output
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
        // the partials visible before the count that may make another work group add them
        memoryBarrierBuffer();
        barrier();
        if (lid == 0)
        {
            const int tile = (z * int(gl_NumWorkGroups.y) + int(gl_WorkGroupID.y)) * int(gl_NumWorkGroups.x)
                             + int(gl_WorkGroupID.x);
            last_of_tile[0] = atomicAdd(tile_count[tile], 1u) == uint(KSPLIT - 1) ? 1u : 0u;
        }
        barrier();
        if (last_of_tile[0] == 0u)
            return;
        memoryBarrierBuffer();
        add_partials(z, m0, n0, lid);
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
