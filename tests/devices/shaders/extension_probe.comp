#version 450
// Exercises the GLSL extension in one shader: storage/arithmetic types, vec4 and scalar
// loads/stores, the 1<->4 copies, a scalar store into packed storage (two invocations share
// one uint), psc() and a device macro. tests/test_glsl_modes.py checks it against numpy.

layout (constant_id = 0) const int n = 0;        // number of vec4 elements
layout (constant_id = 1) const float scale = 0;

layout (binding = 0) readonly buffer a_blob { sfpvec4 a_data[]; };
layout (binding = 1) writeonly buffer b_blob { sfpvec4 b_data[]; };
layout (binding = 2) readonly buffer c_blob { sfp c_data[]; };
layout (binding = 3) writeonly buffer d_blob { sfpvec4 d_data[]; };
layout (binding = 4) writeonly buffer e_blob { sfp e_data[]; };
layout (binding = 5) buffer f_blob { sfp f_data[]; };

layout (push_constant) uniform parameter
{
    int n;
    float scale;
} p;

void main()
{
    const int gi = int(gl_GlobalInvocationID.x);
    const int count = psc(n);
    if (gi >= count * 4)
        return;

    // one scalar per invocation: neighbours write the two halves of one packed uint
    afp c = buffer_ld1(c_data, gi);
#if ncnn_subgroupSize
    afp bump = afp(ncnn_subgroupSize);
#else
    afp bump = afp(-1);
#endif
    buffer_st1(f_data, gi, c * afp(2) + bump);

    if (gi >= count)
        return;

    afpvec4 a = buffer_ld4(a_data, gi);
    buffer_st4(b_data, gi, a * afp(psc(scale)) + afpvec4(1, 2, 3, 4));

    // d[gi] = (c[4gi+3], c[4gi+2], c[4gi+1], c[4gi])
    buffer_cp1to4(d_data, gi, c_data, ivec4(gi * 4 + 3, gi * 4 + 2, gi * 4 + 1, gi * 4));
    // e[4gi + 3 - k] = a[gi][k]
    buffer_cp4to1(e_data, ivec4(gi * 4 + 3, gi * 4 + 2, gi * 4 + 1, gi * 4), a_data, gi);
}
