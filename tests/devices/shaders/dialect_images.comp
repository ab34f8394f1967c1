#version 450
// Every image type and helper of the dialect (old seed document), for DIM = 1, 2 or 3.
// Invocation (x, y, z) owns element x of an 8-wide image row (texels 2x and 2x+1).
#if !NCNN_image_shader
#error "compile with the image_storage option: NCNN_image_shader must be 1"
#endif

layout (constant_id = 0) const int w = 0;

#if DIM == 1
#define SAMPLER sampler1D
#define IMAGE image1D
#define P(x) (x)
#define LD1 image1d_ld1
#define LD4 image1d_ld4
#define LD8 image1d_ld8
#define ST1 image1d_st1
#define ST4 image1d_st4
#define ST8 image1d_st8
#define CP1 image1d_cp1
#define CP4 image1d_cp4
#define CP8 image1d_cp8
#elif DIM == 2
#define SAMPLER sampler2D
#define IMAGE image2D
#define P(x) ivec2(x, gy)
#define LD1 image2d_ld1
#define LD4 image2d_ld4
#define LD8 image2d_ld8
#define ST1 image2d_st1
#define ST4 image2d_st4
#define ST8 image2d_st8
#define CP1 image2d_cp1
#define CP4 image2d_cp4
#define CP8 image2d_cp8
#else
#define SAMPLER sampler3D
#define IMAGE image3D
#define P(x) ivec3(x, gy, gz)
#define LD1 image3d_ld1
#define LD4 image3d_ld4
#define LD8 image3d_ld8
#define ST1 image3d_st1
#define ST4 image3d_st4
#define ST8 image3d_st8
#define CP1 image3d_cp1
#define CP4 image3d_cp4
#define CP8 image3d_cp8
#endif

layout (binding = 0) uniform unfp SAMPLER src1;
layout (binding = 1) uniform unfp SAMPLER src4;
layout (binding = 2, imfmt1) writeonly uniform unfp IMAGE st1;
layout (binding = 3, imfmt4) writeonly uniform unfp IMAGE st4;
layout (binding = 4, imfmt4) writeonly uniform unfp IMAGE st8;
layout (binding = 5, imfmtc1) writeonly uniform unfp IMAGE cp1;
layout (binding = 6, imfmtc4) writeonly uniform unfp IMAGE cp4;
layout (binding = 7, imfmtc4) writeonly uniform unfp IMAGE cp8;

void main()
{
    const int x = int(gl_GlobalInvocationID.x);
    const int gy = int(gl_GlobalInvocationID.y);
    const int gz = int(gl_GlobalInvocationID.z);

    for (int k = 0; k < 2; k++)
    {
        afp v1 = LD1(src1, P(2 * x + k));
        ST1(st1, P(2 * x + k), v1 * afp(2) + afp(1));
        afpvec4 v4 = LD4(src4, P(2 * x + k));
        ST4(st4, P(2 * x + k), v4 * afp(2) + afp(1));
        CP1(cp1, P(2 * x + k), src1, P(2 * x + 1 - k));
        CP4(cp4, P(2 * x + k), src4, P(2 * x + 1 - k));
    }
    afpvec8 v8 = LD8(src4, P(x));
    v8[0] = v8[0] * afp(2) + afp(1);
    v8[1] = v8[1] * afp(2) + afp(1);
    ST8(st8, P(x), v8);
    CP8(cp8, P(x), src4, P(w - 1 - x));
}
