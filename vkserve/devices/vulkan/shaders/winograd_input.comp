#version 450
// Winograd F(m x m, 3 x 3), first pass (conv.py's conv_winograd: this, a batched GEMM, then
// winograd_output.comp), m = tile (2 or 4), n = m + 2. Per input channel c and m x m output
// tile t = (ty, tx), the n x n input patch d whose corner is (m ty - pad_top, m tx - pad_left)
// (pad_value outside the input) becomes V = B^T d B and its element e = n i + j is stored at
// V[e][c][t]: element e's GEMM (K = channels, N = tiles) reads it with the tiles contiguous.
// B^T is Lavin and Gray's (vulkan/winograd.py has the same matrices). Sums are float in every
// mode, rounded once on store. One invocation per (tile, channel): gl_GlobalInvocationID = (t, c).
#extension GL_EXT_control_flow_attributes : require

layout (constant_id = 0) const int w = 0;
layout (constant_id = 1) const int h = 0;
layout (constant_id = 2) const int c = 0;
layout (constant_id = 3) const int tiles_w = 0;
layout (constant_id = 4) const int tiles_h = 0;
layout (constant_id = 5) const int pad_left = 0;
layout (constant_id = 6) const int pad_top = 0;
layout (constant_id = 7) const float pad_value = 0;
layout (constant_id = 8) const int tile = 2;  // m: outputs per tile side, 2 or 4

layout (binding = 0) readonly buffer bottom_blob { sfp bottom_blob_data[]; };
layout (binding = 1) buffer v_blob { sfp v_data[]; };

layout (push_constant) uniform parameter
{
    int w;
    int h;
    int c;
    int tiles_w;
    int tiles_h;
    int pad_left;
    int pad_top;
    float pad_value;
} p;

const int N = tile + 2;
// B^T, row-major: F(2, 3) in the top-left 4 x 4 of a 6 x 6 table, F(4, 3) the whole table
const float BT2[36] = float[36](1, 0, -1, 0, 0, 0,   0, 1, 1, 0, 0, 0,   0, -1, 1, 0, 0, 0,
                                0, 1, 0, -1, 0, 0,   0, 0, 0, 0, 0, 0,   0, 0, 0, 0, 0, 0);
const float BT4[36] = float[36](4, 0, -5, 0, 1, 0,   0, -4, -4, 1, 1, 0,   0, 4, -4, -1, 1, 0,
                                0, -2, -1, 2, 1, 0,  0, 2, -1, -2, 1, 0,   0, 4, 0, -5, 0, 1);

float bt(int i, int k)
{
    return tile == 4 ? BT4[i * 6 + k] : BT2[i * 6 + k];
}

void main()
{
    const int gx = int(gl_GlobalInvocationID.x);
    const int gy = int(gl_GlobalInvocationID.y);
    const int TW = psc(tiles_w);
    const int T = TW * psc(tiles_h);
    if (gx >= T || gy >= psc(c))
        return;

    const int W = psc(w);
    const int H = psc(h);
    const int ty = gx / TW;
    const int x0 = tile * (gx - ty * TW) - psc(pad_left);
    const int y0 = tile * ty - psc(pad_top);
    const float padv = psc(pad_value);
    const int ci = gy * W * H;

    float d[N][N];
    [[unroll]] for (int i = 0; i < N; i++)
    {
        const int iy = y0 + i;
        const bool yin = uint(iy) < uint(H);
        [[unroll]] for (int j = 0; j < N; j++)
        {
            const int ix = x0 + j;
            d[i][j] = yin && uint(ix) < uint(W) ? float(buffer_ld1(bottom_blob_data, ci + iy * W + ix)) : padv;
        }
    }

    // rows: r = B^T d
    float r[N][N];
    [[unroll]] for (int i = 0; i < N; i++)
    {
        [[unroll]] for (int j = 0; j < N; j++)
        {
            float s = 0.0;
            [[unroll]] for (int k = 0; k < N; k++)
                s += bt(i, k) * d[k][j];
            r[i][j] = s;
        }
    }

    // columns: V = r B, element (i, j) at V[n i + j][c][t]
    const int plane = psc(c) * T;
    const int o = gy * T + gx;
    [[unroll]] for (int i = 0; i < N; i++)
    {
        [[unroll]] for (int j = 0; j < N; j++)
        {
            float s = 0.0;
            [[unroll]] for (int k = 0; k < N; k++)
                s += r[i][k] * bt(j, k);
            buffer_st1(v_data, o + (i * N + j) * plane, afp(s));
        }
    }
}
