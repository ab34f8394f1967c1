#version 450
// ArgMax: the `topk` largest of `size` elements, largest first, a tie to the larger index
// (ncnn's order of (value, index) pairs). One work group of 64: pass k keeps, per lane, the
// greatest pair of its strided share below pass k-1's pick, then a shared-memory tree picks
// the greatest of those. Writes indices (as floats) to row 0, or with out_max_val values to
// row 0 and indices to row 1.
layout (local_size_x = 64) in;

layout (constant_id = 0) const int out_max_val = 0;

layout (binding = 0) readonly buffer bottom_blob { sfp bottom_blob_data[]; };
layout (binding = 1) buffer top_blob { sfp top_blob_data[]; };

layout (push_constant) uniform parameter
{
    int size;
    int topk;
} p;

shared float best_v[64];
shared int best_i[64];

// (v, i) comes after (w, j) in the order: smaller value, or the same value and smaller index
bool after(float v, int i, float w, int j)
{
    return v < w || (v == w && i < j);
}

void main()
{
    const int lid = int(gl_LocalInvocationID.x);
    float prev_v = 0.0;
    int prev_i = p.size;  // pass 0: every pair qualifies
    for (int k = 0; k < p.topk; k++)
    {
        float v = 0.0;
        int i = -1;
        for (int j = lid; j < p.size; j += 64)
        {
            const float x = float(buffer_ld1(bottom_blob_data, j));
            if ((k == 0 || after(x, j, prev_v, prev_i)) && (i < 0 || after(v, i, x, j)))
            {
                v = x;
                i = j;
            }
        }
        best_v[lid] = v;
        best_i[lid] = i;
        barrier();
        for (int st = 32; st > 0; st >>= 1)
        {
            if (lid < st && best_i[lid + st] >= 0
                && (best_i[lid] < 0 || after(best_v[lid], best_i[lid], best_v[lid + st], best_i[lid + st])))
            {
                best_v[lid] = best_v[lid + st];
                best_i[lid] = best_i[lid + st];
            }
            barrier();
        }
        prev_v = best_v[0];
        prev_i = best_i[0];
        barrier();  // everyone has read the pick before the next pass overwrites it
        if (lid == 0)
        {
            if (out_max_val == 1)
            {
                buffer_st1(top_blob_data, k, afp(prev_v));
                buffer_st1(top_blob_data, p.topk + k, afp(float(prev_i)));
            }
            else
            {
                buffer_st1(top_blob_data, k, afp(float(prev_i)));
            }
        }
    }
}
