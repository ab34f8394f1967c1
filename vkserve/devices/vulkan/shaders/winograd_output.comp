#version 450
// Winograd F(2x2, 3x3), last pass (conv.py's conv_winograd): per output channel oc and 2 x 2
// tile t, the GEMMs' 4 x 4 products m (M[e][oc][t], e = 4 i + j) become the tile's outputs
// Y = A^T m A, A^T = [1 1 1 0; 0 1 -1 -1], plus the bias, then (a folded residual sum) the
// residual, then the activation, stored where the tile lies inside the output (a tile may
// overhang an odd-sized output by a row or a column). Sums are float in every mode.
// One invocation per (tile, output channel): gl_GlobalInvocationID = (t, oc).

#extension GL_EXT_control_flow_attributes : require

layout (constant_id = 0) const int outw = 0;
layout (constant_id = 1) const int outh = 0;
layout (constant_id = 2) const int oc = 0;
layout (constant_id = 3) const int tiles_w = 0;
layout (constant_id = 4) const int tiles_h = 0;
layout (constant_id = 5) const int activation_type = 0;
layout (constant_id = 6) const float activation_param_0 = 0;
layout (constant_id = 7) const float activation_param_1 = 0;
layout (constant_id = 8) const int residual = 0;  // 1: add residual_blob before the activation

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
    float m[4][4];
    [[unroll]] for (int e = 0; e < 16; e++)
        m[e / 4][e % 4] = float(buffer_ld1(m_data, o + e * plane));

    // rows: s = A^T m
    float s[2][4];
    [[unroll]] for (int j = 0; j < 4; j++)
    {
        s[0][j] = m[0][j] + m[1][j] + m[2][j];
        s[1][j] = m[1][j] - m[2][j] - m[3][j];
    }

    const int OUTW = psc(outw);
    const int OUTH = psc(outh);
    const int ty = gx / TW;
    const int y0 = 2 * ty;
    const int x0 = 2 * (gx - ty * TW);
    const float bias = float(buffer_ld1(bias_data, gy));
    [[unroll]] for (int i = 0; i < 2; i++)
    {
        if (y0 + i >= OUTH)
            break;
        const int row = (gy * OUTH + y0 + i) * OUTW + x0;
        const float y[2] = float[2](s[i][0] + s[i][1] + s[i][2], s[i][1] - s[i][2] - s[i][3]);
        [[unroll]] for (int j = 0; j < 2; j++)
        {
            if (x0 + j < OUTW)
            {
                float v = y[j] + bias;
                if (residual == 1)
                    v += float(buffer_ld1(residual_data, row + j));
                buffer_st1(top_blob_data, row + j, afp(activate(v)));
            }
        }
    }
}
