#version 450
// Winograd F(2x2, 3x3), first pass (conv.py's conv_winograd: this, a batched GEMM, then
// winograd_output.comp). Per input channel c and 2 x 2 output tile t = (ty, tx), the 4 x 4
// input patch d whose corner is (2 ty - pad_top, 2 tx - pad_left) (pad_value outside the
// input) becomes V = B^T d B, B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1], and its element
// e = 4 i + j is stored at V[e][c][t]: element e's GEMM (K = channels, N = tiles) reads it with
// the tiles contiguous. Only additions: the transform is exact in float, rounded once on store.
// One invocation per (tile, channel): gl_GlobalInvocationID = (t, c).

#extension GL_EXT_control_flow_attributes : require

layout (constant_id = 0) const int w = 0;
layout (constant_id = 1) const int h = 0;
layout (constant_id = 2) const int c = 0;
layout (constant_id = 3) const int tiles_w = 0;
layout (constant_id = 4) const int tiles_h = 0;
layout (constant_id = 5) const int pad_left = 0;
layout (constant_id = 6) const int pad_top = 0;
layout (constant_id = 7) const float pad_value = 0;

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
    const int x0 = 2 * (gx - ty * TW) - psc(pad_left);
    const int y0 = 2 * ty - psc(pad_top);
    const float padv = psc(pad_value);
    const int ci = gy * W * H;

    float d[4][4];
    [[unroll]] for (int i = 0; i < 4; i++)
    {
        const int iy = y0 + i;
        const bool yin = uint(iy) < uint(H);
        [[unroll]] for (int j = 0; j < 4; j++)
        {
            const int ix = x0 + j;
            d[i][j] = yin && uint(ix) < uint(W) ? float(buffer_ld1(bottom_blob_data, ci + iy * W + ix)) : padv;
        }
    }

    // rows: r = B^T d
    float r[4][4];
    [[unroll]] for (int j = 0; j < 4; j++)
    {
        r[0][j] = d[0][j] - d[2][j];
        r[1][j] = d[1][j] + d[2][j];
        r[2][j] = d[2][j] - d[1][j];
        r[3][j] = d[1][j] - d[3][j];
    }

    // columns: V = r B, element (i, j) at V[4 i + j][c][t]
    const int plane = psc(c) * T;
    const int o = gy * T + gx;
    [[unroll]] for (int i = 0; i < 4; i++)
    {
        const int e = o + 4 * i * plane;
        buffer_st1(v_data, e, afp(r[i][0] - r[i][2]));
        buffer_st1(v_data, e + plane, afp(r[i][1] + r[i][2]));
        buffer_st1(v_data, e + 2 * plane, afp(r[i][2] - r[i][1]));
        buffer_st1(v_data, e + 3 * plane, afp(r[i][1] - r[i][3]));
    }
}
