#version 450
// b = a * 2 + 1 over int8 values, written once for every int8 option bit:
// int8_t buffers (int8 storage), four values in one int (int8 packed) or one
// value per int, computed in int8_t (int8 arithmetic) or in int.

layout (constant_id = 0) const int n = 0;

#if NCNN_int8_storage
layout (binding = 0) readonly buffer a_blob { int8_t a[]; };
layout (binding = 1) writeonly buffer b_blob { int8_t b[]; };
#else
layout (binding = 0) readonly buffer a_blob { int a[]; };
layout (binding = 1) writeonly buffer b_blob { int b[]; };
#endif

layout (push_constant) uniform parameter { int n; } p;

void main()
{
    const int g = int(gl_GlobalInvocationID.x);
    if (g >= psc(n)) return;

#if NCNN_int8_storage
    ivec4 v = ivec4(int(a[g * 4]), int(a[g * 4 + 1]), int(a[g * 4 + 2]), int(a[g * 4 + 3]));
#elif NCNN_int8_packed
    const int w = a[g];
    ivec4 v = ivec4(bitfieldExtract(w, 0, 8), bitfieldExtract(w, 8, 8), bitfieldExtract(w, 16, 8), bitfieldExtract(w, 24, 8));
#else
    ivec4 v = ivec4(a[g * 4], a[g * 4 + 1], a[g * 4 + 2], a[g * 4 + 3]);
#endif

#if NCNN_int8_arithmetic
    i8vec4 r8 = i8vec4(v) * int8_t(2) + int8_t(1);
    ivec4 r = ivec4(r8);
#else
    ivec4 r = v * 2 + 1;
#endif

#if NCNN_int8_storage
    b[g * 4] = int8_t(r.x);
    b[g * 4 + 1] = int8_t(r.y);
    b[g * 4 + 2] = int8_t(r.z);
    b[g * 4 + 3] = int8_t(r.w);
#elif NCNN_int8_packed
    b[g] = (r.x & 0xff) | ((r.y & 0xff) << 8) | ((r.z & 0xff) << 16) | (r.w << 24);
#else
    b[g * 4] = r.x;
    b[g * 4 + 1] = r.y;
    b[g * 4 + 2] = r.z;
    b[g * 4 + 3] = r.w;
#endif
}
