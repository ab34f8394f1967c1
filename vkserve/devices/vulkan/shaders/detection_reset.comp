#version 450
// Yolov3DetectionOutput, step 1 of 3: zero the candidate counter (one invocation).
layout (local_size_x = 1) in;

layout (binding = 0) buffer counter_blob { uint counter[]; };

void main()
{
    counter[0] = 0u;
}
