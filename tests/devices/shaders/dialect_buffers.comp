#version 450
// Every storage, arithmetic and local type and every buffer helper of the
// extended-GLSL dialect (both seed documents). Invocation g owns 8 scalars:
// sfp elements 8g..8g+7, sfpvec2 4g..4g+3, sfpvec4 2g, 2g+1 and sfpvec8 g.
// The local size must be even and divide the invocation count (neighbours
// g and g^1 exchange values through shared memory).

layout (constant_id = 0) const int n = 0;

layout (binding = 0) readonly buffer a1_blob { sfp a1[]; };
layout (binding = 1) readonly buffer a2_blob { sfpvec2 a2[]; };
layout (binding = 2) readonly buffer a4_blob { sfpvec4 a4[]; };
layout (binding = 3) readonly buffer a8_blob { sfpvec8 a8[]; };
layout (binding = 4) buffer r1_blob { sfp r1[]; };
layout (binding = 5) writeonly buffer r2_blob { sfpvec2 r2[]; };
layout (binding = 6) writeonly buffer r4_blob { sfpvec4 r4[]; };
layout (binding = 7) writeonly buffer r8_blob { sfpvec8 r8[]; };
layout (binding = 8) buffer c1_blob { sfp c1[]; };
layout (binding = 9) writeonly buffer c2_blob { sfpvec2 c2[]; };
layout (binding = 10) writeonly buffer c4_blob { sfpvec4 c4[]; };
layout (binding = 11) writeonly buffer c8_blob { sfpvec8 c8[]; };
layout (binding = 12) writeonly buffer c1to4_blob { sfpvec4 c1to4[]; };
layout (binding = 13) writeonly buffer c1to8_blob { sfpvec8 c1to8[]; };
layout (binding = 14) writeonly buffer c4to8_blob { sfpvec8 c4to8[]; };
layout (binding = 15) buffer c4to1_blob { sfp c4to1[]; };
layout (binding = 16) buffer c8to1_blob { sfp c8to1[]; };
layout (binding = 17) writeonly buffer c8to4_blob { sfpvec4 c8to4[]; };
layout (binding = 18) buffer l1_blob { sfp l1[]; };
layout (binding = 19) writeonly buffer l4_blob { sfpvec4 l4[]; };
layout (binding = 20) buffer m1_blob { sfp m1[]; };
layout (binding = 21) writeonly buffer m4_blob { sfpvec4 m4[]; };
layout (binding = 22) buffer s1_blob { sfp s1[]; };

layout (push_constant) uniform parameter { int n; } p;

shared lfp t1[64 * 8];
shared lfpvec4 t4[64 * 2];

void main()
{
    const int g = int(gl_GlobalInvocationID.x);
    const int lx = int(gl_LocalInvocationID.x);
    const int N = psc(n);
    const int o = (g ^ 1) - g; // offset to the neighbour

    // loads, arithmetic in afp*, stores
    for (int k = 0; k < 8; k++)
    {
        afp v = buffer_ld1(a1, g * 8 + k);
        buffer_st1(r1, g * 8 + k, v * afp(2) + afp(1));
    }
    for (int j = 0; j < 4; j++)
    {
        afpvec2 v = buffer_ld2(a2, g * 4 + j);
        buffer_st2(r2, g * 4 + j, v * afp(2) + afp(1));
    }
    for (int j = 0; j < 2; j++)
    {
        afpvec4 v = buffer_ld4(a4, g * 2 + j);
        buffer_st4(r4, g * 2 + j, v * afp(2) + afp(1));
    }
    afpvec8 v8 = buffer_ld8(a8, g);
    v8[0] = v8[0] * afp(2) + afp(1);
    v8[1] = v8[1] * afp(2) + afp(1);
    buffer_st8(r8, g, v8);

    // plain copies (reversed / mirrored)
    for (int k = 0; k < 8; k++)
        buffer_cp1(c1, g * 8 + k, a1, g * 8 + 7 - k);
    for (int j = 0; j < 4; j++)
        buffer_cp2(c2, g * 4 + j, a2, g * 4 + 3 - j);
    for (int j = 0; j < 2; j++)
        buffer_cp4(c4, g * 2 + j, a4, g * 2 + 1 - j);
    buffer_cp8(c8, g, a8, N - 1 - g);

    // packing copies: scalars gathered through permutations, from this and the next owner
    const int h = (g + 1) % N;
    ivec4 p3[2];
    ivec4 p5[2];
    for (int j = 0; j < 2; j++)
    {
        p3[j] = (ivec4(4 * j) + ivec4(0, 1, 2, 3)) * 3 + 1;
        p3[j] = p3[j] - (p3[j] / 8) * 8;
        p5[j] = (ivec4(4 * j) + ivec4(0, 1, 2, 3)) * 5 + 2;
        p5[j] = p5[j] - (p5[j] / 8) * 8;
    }
    for (int j = 0; j < 2; j++)
        buffer_cp1to4(c1to4, g * 2 + j, a1, g * 8 + p3[j]);
    buffer_cp1to8(c1to8, g, a1, h * 8 + p5[0], h * 8 + p5[1]);
    buffer_cp4to8(c4to8, g, a4, ivec2(g * 2 + 1, g * 2));
    for (int j = 0; j < 2; j++)
        buffer_cp4to1(c4to1, g * 8 + p3[j], a4, g * 2 + j);
    buffer_cp8to1(c8to1, g * 8 + p5[0], g * 8 + p5[1], a8, g);
    buffer_cp8to4(c8to4, ivec2(g * 2 + 1, g * 2), a8, g);

    // shared memory: stage, exchange with the neighbour, convert to afp
    for (int k = 0; k < 8; k++)
        t1[lx * 8 + k] = buffer_sm1(a1, g * 8 + k);
    t4[lx * 2] = buffer_sm4(a4, g * 2);
    t4[lx * 2 + 1] = sfp2lfpvec4(a4[g * 2 + 1]);
    barrier();
    for (int k = 0; k < 8; k++)
        buffer_st1(l1, g * 8 + k, lfp2afp(t1[(lx + o) * 8 + k]) * afp(2));
    for (int j = 0; j < 2; j++)
        buffer_st4(l4, g * 2 + j, lfp2afpvec4(t4[(lx + o) * 2 + j]) * afp(2));
    barrier();
    // afp -> local -> afp round trip of computed values
    for (int k = 0; k < 8; k++)
        t1[lx * 8 + k] = afp2lfp(buffer_ld1(a1, g * 8 + k) * afp(-2));
    for (int j = 0; j < 2; j++)
        t4[lx * 2 + j] = afp2lfpvec4(buffer_ld4(a4, g * 2 + j) * afp(-2));
    barrier();
    for (int k = 0; k < 8; k++)
        buffer_st1(m1, g * 8 + k, lfp2afp(t1[(lx + o) * 8 + k]));
    for (int j = 0; j < 2; j++)
        buffer_st4(m4, g * 2 + j, lfp2afpvec4(t4[(lx + o) * 2 + j]));

    // sfp2lfp of one storage element: the value itself, or with packed fp16 its low half
    barrier();
    t1[lx] = sfp2lfp(a1[g]);
    barrier();
    buffer_st1(s1, g, lfp2afp(t1[lx]));
}
