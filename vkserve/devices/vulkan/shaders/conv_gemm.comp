#version 450
// Convolution as an implicit GEMM with shared-memory tiles and an in-work-group split of K.
// Per group g: top[m][n] = activate(bias[m] + sum_k A[k][m] * B[k][n] [+ residual[m][n]]) with m an output
// channel of the group, n = out y * outw + out x, k = ic * kernel_h * kernel_w + ky * kernel_w
// + kx, and B the im2col of the input (never stored: each tile is gathered from the input,
// with pad_value in the padding). Handles every kernel, stride, dilation, pad and group; 1x1
// stride-1 convs are the same code with the constants folded by specialization.
//
// One work group of 256 invocations computes a BM x BN output tile (gl_WorkGroupID =
// (pixel tile, channel tile, group)). It is KS slices of BM * BN / 16 invocations, each
// invocation of a slice a 4 x 4 block (4 channels x 4 pixels) of the tile: BM * BN * KS =
// 4096. Each step of the K loop takes BK * KS values of k: slice s stages rows
// [k0 + s * BK, k0 + (s + 1) * BK) of A and B into shared memory (the next step's values are
// loaded into registers while this step computes) and multiplies them into its own
// accumulators; at the end the slices' tiles are added through shared memory. Many slices
// (KS up to 16) give small outputs enough invocations, one slice gives large outputs the
// biggest tile: the layer picks BM, BN, KS and BK per shape.
//
// weight: sfpvec4 [group][kpad][mpad / 4]: A[k][m], zero past icg * k * k and past ocg, so A
//         is read without bounds checks (kpad is a multiple of BK * KS, mpad of BM);
// bias:   sfp [group * ocg] (zeros without bias).
// Sums are float in every mode.
//
// A batch's items run in one dispatch: the pixel tiles of item i are work groups
// [i * tiles, (i + 1) * tiles) along x, and the item's input, output and residual lie
// item_stride elements after item i - 1's (the bindings span every item, DESIGN §7).
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
layout (constant_id = 15) const int kpad = 0;      // rows of A per group
layout (constant_id = 16) const int mpad = 0;      // columns of A per group
// tile shape (not shapes of the data: never 0, no push-constant fallback)
layout (constant_id = 17) const int BM = 64;       // 16, 32 or 64
layout (constant_id = 18) const int BN = 64;       // 16, 32 or 64
layout (constant_id = 19) const int KS = 1;        // 4096 / (BM * BN)
layout (constant_id = 20) const int BK = 16;       // KS * BK * (BM + BN) <= 4096, BK <= min(BM, BN)
layout (constant_id = 21) const int activation_type = 0;
layout (constant_id = 22) const float activation_param_0 = 0;
layout (constant_id = 23) const float activation_param_1 = 0;
layout (constant_id = 24) const int residual = 0;  // 1: add residual_blob before the activation
layout (constant_id = 25) const int item_stride = 0;  // elements from one item's blobs to the next's

layout (binding = 0) readonly buffer bottom_blob { sfp bottom_blob_data[]; };
layout (binding = 1) buffer top_blob { sfp top_blob_data[]; };
layout (binding = 2) readonly buffer weight_blob { sfpvec4 weight_data[]; };
layout (binding = 3) readonly buffer bias_blob { sfp bias_data[]; };
// a folded Eltwise sum / BinaryOp add: the other operand, in the output's layout (with
// residual = 0 another blob of the layer is bound here, never read)
layout (binding = 4) readonly buffer residual_blob { sfp residual_data[]; };

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

// 16 KiB: the A and B tiles of every slice ([KS][BK][BM / 4] then [KS][BK][BN / 4]), and at
// the end the slices' output tiles ([KS][BM][BN / 4]) for the split-K sum.
shared vec4 smem[1024];

const int TS = BM * BN / 16;          // invocations per slice
const int A_ROWS = TS / (BM / 4);     // A rows staged at once by a slice (= BN / 4)
const int B_ROWS = TS / BN;           // B rows staged at once by a slice (= BM / 16)
const int A_PER = (BK + A_ROWS - 1) / A_ROWS;   // vec4 of A per invocation and step
const int B_PER = (BK + B_ROWS - 1) / B_ROWS;   // values of B per invocation and step
const int B_OFF = KS * BK * (BM / 4);

#include "activate.h"

// output value i: the residual added (a folded residual connection), then the activation
float finish(float v, int i)
{
    if (residual == 1)
        v += float(buffer_ld1(residual_data, i));
    return activate(v);
}

// Row k of the im2col matrix is input channel c, kernel row y, kernel column x: the digits
// (c, y, x) of k in the mixed radix (.., kernel_h, kernel_w). The K loop never divides: a
// row's digits advance by adding the digits of a constant step, with one carry per digit.
ivec3 digits(int k, int KW, int KH)
{
    const int c = k / (KW * KH);
    const int r = k - c * KW * KH;
    const int y = r / KW;
    return ivec3(c, y, r - y * KW);
}

ivec3 add_digits(ivec3 a, ivec3 d, int KW, int KH)
{
    int x = a.z + d.z;
    int y = a.y + d.y;
    if (x >= KW)
    {
        x -= KW;
        y++;
    }
    int c = a.x + d.x;
    if (y >= KH)
    {
        y -= KH;
        c++;
    }
    return ivec3(c, y, x);
}

// Value (c, y, x) of the im2col column of an output pixel (pix0: input index of its window's
// top left corner, iy0 / ix0: that corner's row and column, possibly outside the input):
// pad_value in the padding, 0 past the input channels and where not `ok` (pixels past the
// end, whose results are not stored, and rows past the slice's BK, which are not staged).
// Branch-free: the load always happens (at index 0 when the value is not in the input), so
// the loads of one step are all in flight together.
float im2col(ivec3 d, int iy0, int ix0, int pix0, bool ok)
{
    const int H = psc(h);
    const int W = psc(w);
    const int dy = d.y * psc(dilation_h);
    const int dx = d.z * psc(dilation_w);
    const bool live = ok && d.x < psc(icg);
    const bool inside = uint(iy0 + dy) < uint(H) && uint(ix0 + dx) < uint(W);
    const int i = live && inside ? pix0 + (d.x * H + dy) * W + dx : 0;
    const float v = float(buffer_ld1(bottom_blob_data, i));
    return live ? (inside ? v : psc(pad_value)) : 0.0;
}

void main()
{
    const int lid = int(gl_LocalInvocationIndex);
    const int slice = lid / TS;
    const int t = lid - slice * TS;
    const int g = int(gl_WorkGroupID.z);
    const int m0 = int(gl_WorkGroupID.y) * BM;

    const int W = psc(w);
    const int H = psc(h);
    const int OUTW = psc(outw);
    const int N = OUTW * psc(outh);
    const int tiles = (N + BN - 1) / BN;
    const int item = int(gl_WorkGroupID.x) / tiles;
    const int n0 = (int(gl_WorkGroupID.x) - item * tiles) * BN;
    const int io = item * item_stride;  // the item's first value in every blob binding
    const int KW = psc(kernel_w);
    const int KH = psc(kernel_h);
    const int ICG = psc(icg);
    const int KPAD = psc(kpad);
    const int M4 = psc(mpad) / 4;

    // B (im2col) staging: this invocation always gathers column bn of the tile, rows
    // bk + j * B_ROWS of its slice's BK rows
    const int bn = t % BN;
    const int bk = t / BN;
    const int n = n0 + bn;
    const bool n_in = n < N;
    const int oy = n / OUTW;
    const int iy0 = oy * psc(stride_h) - psc(pad_top);
    const int ix0 = (n - oy * OUTW) * psc(stride_w) - psc(pad_left);
    const int pix0 = io + g * ICG * H * W + iy0 * W + ix0;
    const int b_st = B_OFF + ((slice * BK + bk) * BN + bn) / 4;  // (row * BN + bn) / 4: BN % 4 == 0
    const int b_comp = bn % 4;
    const int STEP = BK * KS;
    ivec3 row = digits(slice * BK + bk, KW, KH);    // row bk of the slice at this step
    const ivec3 row_step = digits(STEP, KW, KH);    // to the same row at the next step
    const ivec3 row_next = digits(B_ROWS, KW, KH);  // to the invocation's next row

    // A (weight) staging: vec4 am of the tile's BM / 4, rows ak + j * A_ROWS
    const int am = t % (BM / 4);
    const int ak = t / (BM / 4);
    const int a_ld = (g * KPAD + slice * BK + ak) * M4 + m0 / 4 + am;
    const int a_st = (slice * BK + ak) * (BM / 4) + am;

    // this invocation's 4 x 4 block: channels ty * 4 + i, pixels tx * 4 + j
    const int tx = t % (BN / 4);
    const int ty = t / (BN / 4);
    const int a_rd = slice * BK * (BM / 4) + ty;
    const int b_rd = B_OFF + slice * BK * (BN / 4) + tx;

    vec4 ra[4];
    float rb[16];
    vec4 acc0 = vec4(0.0);  // acc<j>[i]: channel ty * 4 + i, pixel tx * 4 + j
    vec4 acc1 = vec4(0.0);
    vec4 acc2 = vec4(0.0);
    vec4 acc3 = vec4(0.0);

    // the first step's values; later steps load theirs during the previous step's arithmetic
    [[unroll]] for (int j = 0; j < A_PER; j++)
    {
        if (ak + j * A_ROWS < BK)
            ra[j] = vec4(buffer_ld4(weight_data, a_ld + j * A_ROWS * M4));
    }
    {
        ivec3 d = row;
        [[unroll]] for (int j = 0; j < B_PER; j++)
        {
            rb[j] = im2col(d, iy0, ix0, pix0, n_in && bk + j * B_ROWS < BK);
            d = add_digits(d, row_next, KW, KH);
        }
    }

    for (int k0 = 0; k0 < KPAD; k0 += STEP)
    {
        [[unroll]] for (int j = 0; j < A_PER; j++)
        {
            if (ak + j * A_ROWS < BK)
                smem[a_st + j * A_ROWS * (BM / 4)] = ra[j];
        }
        [[unroll]] for (int j = 0; j < B_PER; j++)
        {
            if (bk + j * B_ROWS < BK)
                smem[b_st + j * B_ROWS * (BN / 4)][b_comp] = rb[j];
        }
        barrier();

        const int k1 = k0 + STEP;
        if (k1 < KPAD)
        {
            [[unroll]] for (int j = 0; j < A_PER; j++)
            {
                if (ak + j * A_ROWS < BK)
                    ra[j] = vec4(buffer_ld4(weight_data, a_ld + (k1 + j * A_ROWS) * M4));
            }
            row = add_digits(row, row_step, KW, KH);
            ivec3 d = row;
            [[unroll]] for (int j = 0; j < B_PER; j++)
            {
                rb[j] = im2col(d, iy0, ix0, pix0, n_in && bk + j * B_ROWS < BK);
                d = add_digits(d, row_next, KW, KH);
            }
        }

        [[unroll]] for (int kk = 0; kk < BK; kk++)
        {
            const vec4 a = smem[a_rd + kk * (BM / 4)];
            const vec4 b = smem[b_rd + kk * (BN / 4)];
            acc0 += a * b.x;
            acc1 += a * b.y;
            acc2 += a * b.z;
            acc3 += a * b.w;
        }
        barrier();
    }

    const int OCG = psc(ocg);
    if (KS == 1)
    {
        for (int i = 0; i < 4; i++)
        {
            const int m = m0 + ty * 4 + i;
            if (m < OCG)
            {
                const int oc = g * OCG + m;
                const float bias = float(buffer_ld1(bias_data, oc));
                const vec4 s = vec4(acc0[i], acc1[i], acc2[i], acc3[i]);
                [[unroll]] for (int j = 0; j < 4; j++)
                {
                    const int nj = n0 + tx * 4 + j;
                    if (nj < N)
                    {
                        const int at = io + oc * N + nj;
                        buffer_st1(top_blob_data, at, finish(s[j] + bias, at));
                    }
                }
            }
        }
        return;
    }

    // split K: every slice's tile to shared memory ([slice][channel][pixel / 4]), then the
    // work group adds them up, one vec4 of 4 pixels per invocation and pass
    for (int i = 0; i < 4; i++)
        smem[(slice * BM + ty * 4 + i) * (BN / 4) + tx] = vec4(acc0[i], acc1[i], acc2[i], acc3[i]);
    barrier();
    for (int e = lid; e < BM * BN / 4; e += 256)
    {
        vec4 s = smem[e];
        for (int q = 1; q < KS; q++)
            s += smem[q * (BM * BN / 4) + e];
        const int ml = e / (BN / 4);
        const int m = m0 + ml;
        if (m < OCG)
        {
            const int oc = g * OCG + m;
            const float bias = float(buffer_ld1(bias_data, oc));
            const int nb = n0 + (e - ml * (BN / 4)) * 4;
            [[unroll]] for (int j = 0; j < 4; j++)
            {
                if (nb + j < N)
                {
                    const int at = io + oc * N + nb + j;
                    buffer_st1(top_blob_data, at, finish(s[j] + bias, at));
                }
            }
        }
    }
}
