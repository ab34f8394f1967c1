#version 450
// Model output, the storage type in the arena -> fp32 in the host-visible staging buffer: the
// counterpart of cast_input.comp, so that fp16 plans do not pay numpy's fp16 -> fp32 pass on
// the host for every output value. `n` counts vec4 elements (blobs are padded to whole vec4s).
layout (binding = 0) readonly buffer src_blob { sfpvec4 src_data[]; };
layout (binding = 1) writeonly buffer dst_blob { vec4 dst_data[]; };

layout (push_constant) uniform parameter
{
    int n;
} p;

void main()
{
    const int gi = int(gl_GlobalInvocationID.x);
    if (gi >= p.n)
        return;
    dst_data[gi] = vec4(buffer_ld4(src_data, gi));
}
