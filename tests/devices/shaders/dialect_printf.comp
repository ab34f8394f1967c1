#version 450
// NCNN_LOGE through GL_EXT_debug_printf when the validation layer is on.

layout (binding = 0) buffer out_blob { int out_data[]; };

void main()
{
    const int gx = int(gl_GlobalInvocationID.x);
#if ncnn_enable_validation_layer
    NCNN_LOGE("vkserve probe gx = %d", gx * 7);
#endif
    out_data[gx] = gx * 7 + ncnn_enable_validation_layer;
}
