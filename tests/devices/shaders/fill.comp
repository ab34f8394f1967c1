#version 450
layout (binding = 0) writeonly buffer out_blob { float data[]; };
layout (push_constant) uniform parameter { float value; } p;
void main() { data[gl_GlobalInvocationID.x] = p.value; }
