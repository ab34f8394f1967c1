#version 450
// Convolution as an implicit GEMM on the tensor cores: VK_KHR_cooperative_matrix products of
// 16 x 16 x 16 fp16 tiles with fp32 accumulators. Same GEMM as conv_gemm.comp (per group g:
// top[m][n] = activate(bias[m] + sum_k A[m][k] * B[k][n] [+ residual[m][n]]), m an output channel of the group,
// n an output pixel, B the im2col of the input, never stored); used in the fp16 storage modes
// on devices with 32-wide subgroups that offer the 16 x 16 x 16 float16_t -> float product
// (the layer checks, conv.py).
//
// K is ordered kernel tap first, input channel second (k = tap * cpad + c, cpad = the group's
// input channels rounded up to BK), so one step of BK values of k is one tap and BK
// consecutive channels: gathering B costs an add and a load per value, the tap's bounds
// checked once per step and column (decoding (c, ky, kx) per value made the first version
// instruction-bound, not tensor-bound).
//
// A work group is 8 subgroups of 32 invocations in a 2 x 4 grid over a BM x BN output tile
// (BM = 32 * FM channels, BN = 64 * FN pixels): each subgroup owns FM x FN accumulators of
// 16 x 16. A and B tiles are double-buffered in shared memory, one barrier per step: the
// next step's values are loaded into registers while this step multiplies, then stored into
// the other buffer. B is staged column-major (8 consecutive k of one pixel: one 16-byte store).
//
// Split K: with ksplit > 1 the grid's z is groups x ksplit and each work group sums
// split_steps steps of K into fp32 partials (partial[split][g][mpad][npad], stored straight
// from the accumulators); a second dispatch of this shader with reduce = 1 adds the partials,
// the bias and the activation, one output per invocation. Layers with few output tiles and a
// long K (deep 3x3 layers) thus still spread over every compute unit.
//
// A batch's items run in one dispatch: the pixel tiles of item i are work groups
// [i * tiles, (i + 1) * tiles) along x (the reduce pass: its pixel groups likewise), and the
// item's input, output, residual and partials lie item_stride elements after item i - 1's
// (the bindings span every item, DESIGN §7).
//
// weight: sfpvec4 [group][mpad][kpad / 4] (A row-major, zero-padded: no bounds checks)
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
layout (constant_id = 15) const int kpad = 0;      // columns of A per group (taps x cpad)
layout (constant_id = 16) const int mpad = 0;      // rows of A per group
layout (constant_id = 17) const int cpad = 0;      // input channels per tap, a multiple of BK
layout (constant_id = 18) const int npad = 0;      // output pixels rounded up to BN (partials' rows)
layout (constant_id = 19) const int ksplit = 0;    // work groups along K
layout (constant_id = 20) const int split_steps = 0;  // steps of BK per split
// tile shape and mode (never 0 or always given, no push-constant fallback)
layout (constant_id = 21) const int FM = 2;        // 16 x 16 fragments per subgroup along m: 1, 2, 4
layout (constant_id = 22) const int FN = 2;        // along n: 1, 2
layout (constant_id = 23) const int activation_type = 0;
layout (constant_id = 24) const float activation_param_0 = 0;
layout (constant_id = 25) const float activation_param_1 = 0;
layout (constant_id = 26) const int reduce = 0;    // 1: the split-K pass adding the partials
layout (constant_id = 27) const int residual = 0;  // 1: add residual_blob before the activation
layout (constant_id = 28) const int item_stride = 0;  // elements (fp16) from one item's blobs to the next's
layout (constant_id = 29) const int defer = 0;     // 1: B's bounds applied in store_step (see load_step)

layout (binding = 0) readonly buffer bottom_blob { sfp bottom_blob_data[]; };
layout (binding = 1) buffer top_blob { sfp top_blob_data[]; };
layout (binding = 2) readonly buffer weight_blob { sfpvec4 weight_data[]; };
layout (binding = 3) readonly buffer bias_blob { sfp bias_data[]; };
layout (binding = 4) buffer partial_blob { float partial_data[]; };
// a folded Eltwise sum / BinaryOp add: the other operand, in the output's layout (with
// residual = 0 another blob of the layer is bound here, never read)
layout (binding = 5) readonly buffer residual_blob { sfp residual_data[]; };

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
    int cpad;
    int npad;
    int ksplit;
    int split_steps;
} p;

const int BM = 32 * FM;
const int BN = 64 * FN;
const int BK = 32;
const int S4 = BK / 4 + 2;             // row (A) / column (B) stride in f16vec4: 80 bytes, so
                                       // that 16-byte pieces of neighbouring rows change banks
const int A_PER = BM * (BK / 4) / 256; // f16vec4 of A per invocation and step (= FM)
const int B_PER = BN * (BK / 8) / 256; // columns x 8 values of B per invocation and step (= FN)

shared f16vec4 tile_a[2 * BM * S4];
shared f16vec4 tile_b[2 * BN * S4];
shared float tile_c[8 * 256];          // one 16 x 16 accumulator per subgroup, for the epilogue

#include "activate.h"

// output value i: the residual added (a folded residual connection), then the activation
float finish(float v, int i)
{
    if (residual == 1)
        v += float(buffer_ld1(residual_data, i));
    return activate(v);
}

// The split-K pass: output (g, m, n) = activate(bias + the partials' sum), in split order.
void reduce_partials()
{
    const int N = psc(outw) * psc(outh);
    const int OCG = psc(ocg);
    const int per_item = (N + int(gl_WorkGroupSize.x) - 1) / int(gl_WorkGroupSize.x);
    const int item = int(gl_WorkGroupID.x) / per_item;
    const int n = (int(gl_WorkGroupID.x) - item * per_item) * int(gl_WorkGroupSize.x) + int(gl_LocalInvocationID.x);
    const int m = int(gl_GlobalInvocationID.y);
    const int grp = int(gl_GlobalInvocationID.z);
    if (n >= N || m >= OCG)
        return;
    const int plane = psc(mpad) * psc(npad);
    const int groups = int(gl_NumWorkGroups.z);
    int at = item * (item_stride / 2) + grp * plane + m * psc(npad) + n;
    float sum = 0.0;
    for (int s = 0; s < psc(ksplit); s++)
    {
        sum += partial_data[at];
        at += groups * plane;
    }
    const int oc = grp * OCG + m;
    const int out_at = item * item_stride + oc * N + n;
    buffer_st1(top_blob_data, out_at, finish(sum + float(buffer_ld1(bias_data, oc)), out_at));
}

// per invocation, fixed for the work group's tile (set once by main)
int g;                                 // group
int base;                              // the group's first input value
int a_ld;                              // A: vec4 ac of row ar + 32 j of the tile
int ar;
int ac;
int bn[B_PER];                         // B: slot lid + 256 j is the 8 values of k from bk[j] * 8
int bk[B_PER];                         // of column bn[j]: neighbours take neighbouring pixels,
int iy0[B_PER];                        // so the loads coalesce; iy0/ix0 the window's corner
int ix0[B_PER];
bool n_in[B_PER];
// the next step, on its way from memory to shared: A as read, B as read (defer = 1: nothing
// may use them before store_step) or bounded and packed (defer = 0)
sfpvec4 ra[A_PER];
sfp rb[B_PER * 8];
f16vec4 rb_packed[B_PER * 2];

// step s's tap (ky, kx) and first input channel
ivec3 step_place(int s)
{
    const int k0 = s * BK;
    const int tap = k0 / psc(cpad);
    const int ky = tap / psc(kernel_w);
    return ivec3(ky, tap - ky * psc(kernel_w), k0 - tap * psc(cpad));
}

// whether column j's input pixel for tap (ky, kx) lies inside the input
bool inside_at(int j, int ky, int kx)
{
    const int iy = iy0[j] + ky * psc(dilation_h);
    const int ix = ix0[j] + kx * psc(dilation_w);
    return n_in[j] && uint(iy) < uint(psc(h)) && uint(ix) < uint(psc(w));
}

// registers <- step s of K: one tap, BK channels from c0. With defer = 1 nothing here uses a
// loaded value: a bounds check's select on one (or a conversion) waits for the load then and
// there, so this step's multiplications no longer hide it. Loads past the input (padding,
// channels past icg) read the group's first value instead; store_step puts the pad value or
// 0 there, deciding again which they are rather than keeping registers for it through the
// step. That costs registers (the 8 values of a column unpacked): where the grid runs at
// several work groups a compute unit, their number matters more (defer = 0: each value
// bounded and packed as it is read; vulkan.layers.conv.coop_defers).
void load_step(int s)
{
    const ivec3 at_k = step_place(s);
    const int k0 = s * BK;
    const int HW = psc(h) * psc(w);
    [[unroll]] for (int j = 0; j < A_PER; j++)
        ra[j] = weight_data[a_ld + (j * 32 * psc(kpad) + k0) / 4];
    [[unroll]] for (int j = 0; j < B_PER; j++)
    {
        const bool inside = inside_at(j, at_k.x, at_k.y);
        const int c = at_k.z + bk[j] * 8;
        const int iy = iy0[j] + at_k.x * psc(dilation_h);
        const int ix = ix0[j] + at_k.y * psc(dilation_w);
        const int at = base + c * HW + iy * psc(w) + ix;
        if (defer == 1)
        {
            [[unroll]] for (int e = 0; e < 8; e++)
                rb[8 * j + e] = bottom_blob_data[inside && c + e < psc(icg) ? at + e * HW : base];
            continue;
        }
        const float16_t pad = float16_t(psc(pad_value));
        float16_t v[8];
        [[unroll]] for (int e = 0; e < 8; e++)
        {
            const bool live = c + e < psc(icg);
            const float16_t x = bottom_blob_data[live && inside ? at + e * HW : base];
            v[e] = live ? (inside ? x : pad) : float16_t(0.0);
        }
        rb_packed[2 * j] = f16vec4(v[0], v[1], v[2], v[3]);
        rb_packed[2 * j + 1] = f16vec4(v[4], v[5], v[6], v[7]);
    }
}

// shared buffer b <- the registers (step s); B's values outside the input become the pad
// value, past the input channels 0 (A is 0 there too: never an unread value)
void store_step(int b, int s)
{
    [[unroll]] for (int j = 0; j < A_PER; j++)
        tile_a[b * BM * S4 + (ar + 32 * j) * S4 + ac] = f16vec4(ra[j]);
    const ivec3 at_k = step_place(s);
    const float16_t pad = float16_t(psc(pad_value));
    [[unroll]] for (int j = 0; j < B_PER; j++)
    {
        const int at = b * BN * S4 + bn[j] * S4 + bk[j] * 2;
        if (defer == 0)
        {
            tile_b[at] = rb_packed[2 * j];
            tile_b[at + 1] = rb_packed[2 * j + 1];
            continue;
        }
        const bool inside = inside_at(j, at_k.x, at_k.y);
        const int c = at_k.z + bk[j] * 8;
        float16_t v[8];
        [[unroll]] for (int e = 0; e < 8; e++)
            v[e] = c + e < psc(icg) ? (inside ? float16_t(rb[8 * j + e]) : pad) : float16_t(0.0);
        tile_b[at] = f16vec4(v[0], v[1], v[2], v[3]);
        tile_b[at + 1] = f16vec4(v[4], v[5], v[6], v[7]);
    }
}

void main()
{
    if (reduce == 1)
    {
        reduce_partials();
        return;
    }
    const int lid = int(gl_LocalInvocationIndex);
    const int sg = int(gl_SubgroupID);
    const int KS = psc(ksplit);
    const int groups = int(gl_NumWorkGroups.z) / KS;
    g = int(gl_WorkGroupID.z) / KS;
    const int split = int(gl_WorkGroupID.z) - g * KS;
    const int m0 = int(gl_WorkGroupID.y) * BM;
    const int tiles = psc(npad) / BN;
    const int item = int(gl_WorkGroupID.x) / tiles;
    const int n0 = (int(gl_WorkGroupID.x) - item * tiles) * BN;
    const int io = item * item_stride;  // the item's first value in the blob bindings
    const int OUTW = psc(outw);
    const int N = OUTW * psc(outh);

    const int first = split * psc(split_steps);
    const int steps = min(psc(split_steps), psc(kpad) / BK - first);

    [[unroll]] for (int j = 0; j < B_PER; j++)
    {
        const int slot = lid + 256 * j;
        bn[j] = slot % BN;
        bk[j] = slot / BN;
        const int n = n0 + bn[j];
        n_in[j] = n < N;
        const int oy = n / OUTW;
        iy0[j] = oy * psc(stride_h) - psc(pad_top);
        ix0[j] = (n - oy * OUTW) * psc(stride_w) - psc(pad_left);
    }
    base = io + g * psc(icg) * psc(h) * psc(w);
    ac = lid % 8;
    ar = lid / 8;
    a_ld = ((g * psc(mpad) + m0 + ar) * psc(kpad)) / 4 + ac;

    // this subgroup's fragments: rows sm + 16 i of the tile, columns sn + 16 j
    const int sm = (sg / 4) * FM * 16;
    const int sn = (sg % 4) * FN * 16;

    coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator> acc[FM * FN];
    [[unroll]] for (int i = 0; i < FM * FN; i++)
        acc[i] = coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>(0.0);

    if (steps > 0)
    {
        load_step(first);
        store_step(0, first);
    }
    barrier();
    for (int s = 0; s < steps; s++)
    {
        const int cur = s & 1;
        if (s + 1 < steps)
            load_step(first + s + 1);
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
            store_step(cur ^ 1, first + s + 1);
        barrier();
    }

    if (KS > 1)
    {
        // partials: every tile lies inside [mpad] x [npad], so no bounds checks
        const int NPAD = psc(npad);
        const int at = item * (item_stride / 2) + ((split * groups + g) * psc(mpad) + m0 + sm) * NPAD + n0 + sn;
        [[unroll]] for (int i = 0; i < FM; i++)
            [[unroll]] for (int j = 0; j < FN; j++)
                coopMatStore(acc[i * FN + j], partial_data, uint(at + 16 * i * NPAD + 16 * j), uint(NPAD),
                             gl_CooperativeMatrixLayoutRowMajor);
        return;
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
                    const int at = io + oc * N + nn;
                    buffer_st1(top_blob_data, at, finish(v, at));
                }
            }
            subgroupMemoryBarrierShared();
            subgroupBarrier();
        }
    }
}
