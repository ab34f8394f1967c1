#version 450
// Convolution as an implicit GEMM on the tensor cores: VK_KHR_cooperative_matrix products of
// 16 x 16 x 16 fp16 tiles with fp32 accumulators. Same GEMM as conv_gemm.comp (per group g:
// top[m][n] = activate(bias[m] + sum_k A[m][k] * B[k][n]), m an output channel of the group,
// n an output pixel, k = (input channel, kernel row, kernel column), B the im2col of the
// input, never stored); used in the fp16 storage modes on devices with 32-wide subgroups that
// offer the 16 x 16 x 16 float16_t -> float product (the layer checks, conv.py).
//
// A work group is 8 subgroups of 32 invocations in a 2 x 4 grid over a BM x BN output tile
// (BM = 32 * FM channels, BN = 64 * FN pixels): each subgroup owns FM x FN accumulators of
// 16 x 16. Each step of the K loop the work group stages BK = 32 columns of A (vec4 loads of
// the weights, laid out as the products read them and zero-padded so no bounds checks are
// needed) and BK rows of B (gathered from the input) in shared memory, the next step's values
// loaded into registers while this step multiplies; every subgroup then multiplies its
// fragments. Fragments come from shared memory only: loaded from the buffers they were 4-8x
// slower on an H100. At the end each subgroup passes its accumulators one by one through
// shared memory to add the bias, apply the activation and store in the blob's layout.
//
// weight: sfpvec4 [group][mpad][kpad / 4] (A row-major; mpad a multiple of BM, kpad of BK)
// bias:   sfp [group * ocg]
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_control_flow_attributes : require
layout (local_size_x = 256) in;

layout (constant_id = 0) const int w = 0;
layout (constant_id = 1) const int h = 0;
layout (constant_id = 2) const int outw = 0;
layout (constant_id = 3) const int outh = 0;
layout (constant_id = 4) const int icg = 0;        // input channels per group
layout (constant_id = 5) const int ocg = 0;        // output channels per group
layout (constant_id = 6) const int kernel_w = 0;
layout (constant_id = 7) const int kernel_h = 0;
layout (constant_id = 8) const int dilation_w = 0;
layout (constant_id = 9) const int dilation_h = 0;
layout (constant_id = 10) const int stride_w = 0;
layout (constant_id = 11) const int stride_h = 0;
layout (constant_id = 12) const int pad_left = 0;
layout (constant_id = 13) const int pad_top = 0;
layout (constant_id = 14) const float pad_value = 0;
layout (constant_id = 15) const int kpad = 0;      // columns of A per group
layout (constant_id = 16) const int mpad = 0;      // rows of A per group
// tile shape (never 0, no push-constant fallback)
layout (constant_id = 17) const int FM = 2;        // 16 x 16 fragments per subgroup along m: 1, 2, 4
layout (constant_id = 18) const int FN = 2;        // along n: 1, 2
layout (constant_id = 19) const int activation_type = 0;
layout (constant_id = 20) const float activation_param_0 = 0;
layout (constant_id = 21) const float activation_param_1 = 0;

layout (binding = 0) readonly buffer bottom_blob { sfp bottom_blob_data[]; };
layout (binding = 1) buffer top_blob { sfp top_blob_data[]; };
layout (binding = 2) readonly buffer weight_blob { sfpvec4 weight_data[]; };
layout (binding = 3) readonly buffer bias_blob { sfp bias_data[]; };

layout (push_constant) uniform parameter
{
    int w;
    int h;
    int outw;
    int outh;
    int icg;
    int ocg;
    int kernel_w;
    int kernel_h;
    int dilation_w;
    int dilation_h;
    int stride_w;
    int stride_h;
    int pad_left;
    int pad_top;
    float pad_value;
    int kpad;
    int mpad;
} p;

const int BM = 32 * FM;
const int BN = 64 * FN;
const int BK = 32;
const int SA = BK + 8;                 // A tile row stride in halves (16-byte aligned rows whose
const int SB = BN + 8;                 // 16-byte pieces fall in distinct banks), B likewise
const int B_ROWS = 256 / BN;           // rows of B one pass of the work group gathers
const int B_PER = BK / B_ROWS;         // values of B per invocation and step
const int A_PER = BM / 32;             // vec4 of A per invocation and step (8 per row of BK)

shared float16_t tile_a[BM * SA];
shared float16_t tile_b[BK * SB];
shared float tile_c[8 * 256];          // one 16 x 16 accumulator per subgroup, for the epilogue

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
        float sp = v > 20.0 ? v : log(1.0 + exp(v));
        float t = exp(-2.0 * sp);
        return v * (1.0 - t) / (1.0 + t);
    }
    if (activation_type == 6)
        return v * clamp(v * activation_param_0 + activation_param_1, 0.0, 1.0);
    return v;
}

// Row k of column n's im2col (its window's top left corner at input row iy0, column ix0):
// pad_value in the padding, 0 past the input channels (the padded rows of K) and for
// pixels past the end.
float16_t im2col(int k, int iy0, int ix0, int base, bool n_in)
{
    const int KW = psc(kernel_w);
    const int KK = KW * psc(kernel_h);
    const int c = k / KK;
    const int r = k - c * KK;
    const int ky = r / KW;
    const int iy = iy0 + ky * psc(dilation_h);
    const int ix = ix0 + (r - ky * KW) * psc(dilation_w);
    const bool live = n_in && c < psc(icg);
    const bool inside = uint(iy) < uint(psc(h)) && uint(ix) < uint(psc(w));
    const int i = live && inside ? base + (c * psc(h) + iy) * psc(w) + ix : 0;
    const float v = float(buffer_ld1(bottom_blob_data, i));
    return float16_t(live ? (inside ? v : psc(pad_value)) : 0.0);
}

void main()
{
    const int lid = int(gl_LocalInvocationIndex);
    const int sg = int(gl_SubgroupID);
    const int g = int(gl_WorkGroupID.z);
    const int m0 = int(gl_WorkGroupID.y) * BM;
    const int n0 = int(gl_WorkGroupID.x) * BN;
    const int OUTW = psc(outw);
    const int N = OUTW * psc(outh);
    const int KPAD = psc(kpad);

    // this invocation gathers column bn of the B tile, rows bk + j * B_ROWS
    const int bn = lid % BN;
    const int bk = lid / BN;
    const int n = n0 + bn;
    const bool n_in = n < N;
    const int oy = n / OUTW;
    const int iy0 = oy * psc(stride_h) - psc(pad_top);
    const int ix0 = (n - oy * OUTW) * psc(stride_w) - psc(pad_left);
    const int base = g * psc(icg) * psc(h) * psc(w);

    // this invocation stages vec4 ac of rows ar + 32 * j of the A tile
    const int ac = lid % 8;
    const int ar = lid / 8;
    const int a_ld = ((g * psc(mpad) + m0 + ar) * KPAD) / 4 + ac;

    // this subgroup's fragments: rows sm + 16 * i of the tile, columns sn + 16 * j
    const int sm = (sg / 4) * FM * 16;
    const int sn = (sg % 4) * FN * 16;

    coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator> acc[FM * FN];
    [[unroll]] for (int i = 0; i < FM * FN; i++)
        acc[i] = coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>(0.0);

    f16vec4 ra[A_PER];
    float16_t rb[B_PER];
    [[unroll]] for (int j = 0; j < A_PER; j++)
        ra[j] = f16vec4(buffer_ld4(weight_data, a_ld + j * 32 * KPAD / 4));
    [[unroll]] for (int j = 0; j < B_PER; j++)
        rb[j] = im2col(bk + j * B_ROWS, iy0, ix0, base, n_in);

    for (int k0 = 0; k0 < KPAD; k0 += BK)
    {
        [[unroll]] for (int j = 0; j < A_PER; j++)
        {
            const int at = (ar + 32 * j) * SA + ac * 4;
            tile_a[at] = ra[j].x;
            tile_a[at + 1] = ra[j].y;
            tile_a[at + 2] = ra[j].z;
            tile_a[at + 3] = ra[j].w;
        }
        [[unroll]] for (int j = 0; j < B_PER; j++)
            tile_b[(bk + j * B_ROWS) * SB + bn] = rb[j];
        barrier();

        const int k1 = k0 + BK;
        if (k1 < KPAD)
        {
            [[unroll]] for (int j = 0; j < A_PER; j++)
                ra[j] = f16vec4(buffer_ld4(weight_data, a_ld + (j * 32 * KPAD + k1) / 4));
            [[unroll]] for (int j = 0; j < B_PER; j++)
                rb[j] = im2col(k1 + bk + j * B_ROWS, iy0, ix0, base, n_in);
        }

        [[unroll]] for (int kk = 0; kk < BK; kk += 16)
        {
            coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB> b[FN];
            [[unroll]] for (int j = 0; j < FN; j++)
                coopMatLoad(b[j], tile_b, uint(kk * SB + sn + 16 * j), uint(SB),
                            gl_CooperativeMatrixLayoutRowMajor);
            [[unroll]] for (int i = 0; i < FM; i++)
            {
                coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> a;
                coopMatLoad(a, tile_a, uint((sm + 16 * i) * SA + kk), uint(SA),
                            gl_CooperativeMatrixLayoutRowMajor);
                [[unroll]] for (int j = 0; j < FN; j++)
                    acc[i * FN + j] = coopMatMulAdd(a, b[j], acc[i * FN + j]);
            }
        }
        barrier();
    }

    const int OCG = psc(ocg);
    const int lane = int(gl_SubgroupInvocationID);
    const int lanes = int(gl_SubgroupSize);
    [[unroll]] for (int i = 0; i < FM; i++)
    {
        [[unroll]] for (int j = 0; j < FN; j++)
        {
            coopMatStore(acc[i * FN + j], tile_c, uint(sg * 256), 16u, gl_CooperativeMatrixLayoutRowMajor);
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            for (int e = lane; e < 256; e += lanes)
            {
                const int m = m0 + sm + 16 * i + e / 16;
                const int nn = n0 + sn + 16 * j + e % 16;
                if (m < OCG && nn < N)
                {
                    const int oc = g * OCG + m;
                    const float v = tile_c[sg * 256 + e] + float(buffer_ld1(bias_data, oc));
                    buffer_st1(top_blob_data, oc * N + nn, activate(v));
                }
            }
            subgroupMemoryBarrierShared();
            subgroupBarrier();
        }
    }
}
