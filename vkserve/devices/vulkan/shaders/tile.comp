#version 450
// Tile: output element (x0, x1, x2, x3) of shape (o0, o1, o2, o3) (o0 implied) copies input
// element (x0 % i0, x1 % i1, x2 % i2, x3 % i3) of the dense input (i0, i1, i2, i3); exact in
// every mode.
layout (binding = 0) readonly buffer bottom_blob { sfp bottom_blob_data[]; };
layout (binding = 1) buffer top_blob { sfp top_blob_data[]; };

layout (push_constant) uniform parameter
{
    int size;
    int o1;
    int o2;
    int o3;
    int i0;
    int i1;
    int i2;
    int i3;
} p;

void main()
{
    // Linear index over a 2-D grid: dispatches of more than 65535 groups go along y too.
    const int gi = int(gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x
                       + gl_GlobalInvocationID.x);
    if (gi >= p.size)
        return;
    int t = gi;
    const int x3 = t % p.o3;
    t /= p.o3;
    const int x2 = t % p.o2;
    t /= p.o2;
    const int x1 = t % p.o1;
    const int x0 = t / p.o1;
    const int si = (((x0 % p.i0) * p.i1 + x1 % p.i1) * p.i2 + x2 % p.i2) * p.i3 + x3 % p.i3;
    buffer_cp1(top_blob_data, gi, bottom_blob_data, si);
}
