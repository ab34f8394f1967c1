#version 450
// Winograd F(m x m, 3 x 3), last pass (conv.py's conv_winograd), m = tile (2 or 4), n = m + 2:
// per output channel oc and m x m tile t, the GEMMs' n x n products (M[e][oc][t], e = n i + j)
// become the tile's outputs Y = A^T M A (Lavin and Gray's A^T, as in vulkan/winograd.py), plus
// the bias, then (a folded residual sum) the residual, then the activation, stored where the
// tile lies inside the output (the last tiles may overhang it). Sums are float in every mode.
// One invocation per (tile, output channel): gl_GlobalInvocationID = (t, oc).
#extension GL_EXT_control_flow_attributes : require

layout (constant_id = 0) const int outw = 0;
layout (constant_id = 1) const int outh = 0;
layout (constant_id = 2) const int oc = 0;
layout (constant_id = 3) const int tiles_w = 0;
layout (constant_id = 4) const int tiles_h = 0;
layout (constant_id = 5) const int tile = 2;  // m: outputs per tile side, 2 or 4
layout (constant_id = 6) const int activation_type = 0;
layout (constant_id = 7) const float activation_param_0 = 0;
layout (constant_id = 8) const float activation_param_1 = 0;
layout (constant_id = 9) const int residual = 0;  // 1: add residual_blob before the activation

layout (binding = 0) readonly buffer m_blob { sfp m_data[]; };
layout (binding = 1) buffer top_blob { sfp top_blob_data[]; };
layout (binding = 2) readonly buffer bias_blob { sfp bias_data[]; };
// with residual = 0 another blob of the layer is bound here, never read
layout (binding = 3) readonly buffer residual_blob { sfp residual_data[]; };

layout (push_constant) uniform parameter
{
    int outw;
    int outh;
    int oc;
    int tiles_w;
    int tiles_h;
} p;

#include "activate.h"

const int N = tile + 2;
// A^T, row-major: F(2, 3) in the top-left 2 x 4 of a 4 x 6 table, F(4, 3) the whole table
const float AT2[24] = float[24](1, 1, 1, 0, 0, 0,   0, 1, -1, -1, 0, 0,
                                0, 0, 0, 0, 0, 0,   0, 0, 0, 0, 0, 0);
const float AT4[24] = float[24](1, 1, 1, 1, 1, 0,   0, 1, -1, 2, -2, 0,
                                0, 1, 1, 4, 4, 0,   0, 1, -1, 8, -8, 1);

float at(int i, int k)
{
    return tile == 4 ? AT4[i * 6 + k] : AT2[i * 6 + k];
}

void main()
{
    const int gx = int(gl_GlobalInvocationID.x);
    const int gy = int(gl_GlobalInvocationID.y);
    const int TW = psc(tiles_w);
    const int T = TW * psc(tiles_h);
    if (gx >= T || gy >= psc(oc))
        return;

    const int plane = psc(oc) * T;
    const int o = gy * T + gx;
    float m[N][N];
    [[unroll]] for (int e = 0; e < N * N; e++)
        m[e / N][e % N] = float(buffer_ld1(m_data, o + e * plane));

    // rows: s = A^T m
    float s[tile][N];
    [[unroll]] for (int i = 0; i < tile; i++)
    {
        [[unroll]] for (int j = 0; j < N; j++)
        {
            float v = 0.0;
            [[unroll]] for (int k = 0; k < N; k++)
                v += at(i, k) * m[k][j];
            s[i][j] = v;
        }
    }

    const int OUTW = psc(outw);
    const int OUTH = psc(outh);
    const int ty = gx / TW;
    const int y0 = tile * ty;
    const int x0 = tile * (gx - ty * TW);
    const float bias = float(buffer_ld1(bias_data, gy));
    [[unroll]] for (int i = 0; i < tile; i++)
    {
        if (y0 + i >= OUTH)
            break;
        const int row = (gy * OUTH + y0 + i) * OUTW + x0;
        [[unroll]] for (int j = 0; j < tile; j++)
        {
            if (x0 + j < OUTW)
            {
                float v = bias;
                [[unroll]] for (int k = 0; k < N; k++)
                    v += s[i][k] * at(j, k);
                if (residual == 1)
                    v += float(buffer_ld1(residual_data, row + j));
                buffer_st1(top_blob_data, row + j, afp(activate(v)));
            }
        }
    }
}
