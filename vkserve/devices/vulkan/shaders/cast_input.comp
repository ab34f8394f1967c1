#version 450
// Model input, fp32 in the host-visible staging buffer -> the storage type in the arena.
// Converting on the GPU is what keeps fp16 plans from paying numpy's slow fp32->fp16 pass
// on the host. `n` counts vec4 elements (blobs are padded to whole vec4s on both sides).
layout (constant_id = 0) const int n = 0;

layout (binding = 0) readonly buffer src_blob { vec4 src_data[]; };
layout (binding = 1) writeonly buffer dst_blob { sfpvec4 dst_data[]; };

layout (push_constant) uniform parameter
{
    int n;
} p;

void main()
{
    const int gi = int(gl_GlobalInvocationID.x);
    if (gi >= psc(n))
        return;
    buffer_st4(dst_data, gi, afpvec4(src_data[gi]));
}
