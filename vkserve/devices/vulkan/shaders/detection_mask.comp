#version 450
// Yolov3DetectionOutput, step 3 of 3: the NMS overlap bitmask of the candidates.
// Invocation (i, word): bit b of mask[i * words + word] = IoU(candidate i, candidate 32 word + b)
// > threshold, for candidates (slots) below the counter; rows at or past it are not written.
// The IoU is float32 exactly as numpy computes it (models/detection.py `overlaps`: inter 0
// for boxes apart, else iw * ih; union = (area_i + area_j) - inter), and the decision
// fl32(inter / union) > thr is taken without a division (GPU division is not correctly
// rounded): with thr_up the next float above thr and mid = (thr + thr_up) / 2,
// fl32(q) > thr  <=>  q > mid. (q == mid cannot happen: mid has 25 significant bits with an
// odd last one, so mid * union never is a float32 such as inter.) mid * union has at most
// 25 + 24 significant bits, so it is exact in a double.
layout (local_size_x = 64) in;

#ifdef ncnn_shaderFloat64
#if ncnn_shaderFloat64
#define DETECTION_FP64 1
#endif
#endif

// nan_over: an IoU of NaN (0 / 0) counts as above the threshold (YoloDetectionOutput and
// DetectionOutput as ncnn is built; Yolov3DetectionOutput leaves it 0).
layout (constant_id = 0) const int nan_over = 0;

layout (binding = 0) readonly buffer counter_blob { uint counter[]; };
layout (binding = 1) readonly buffer record_blob { vec4 records[]; };
layout (binding = 2) writeonly buffer mask_blob { uint mask[]; };

layout (push_constant) uniform parameter
{
    int words;      // mask words per row: ceil(capacity / 32)
    float thr;      // the largest float32 t with numpy's (t > threshold) false
    float half_ulp; // (thr_up - thr) / 2: a power of two
} p;

bool over(float inter, float uni)
{
#ifdef DETECTION_FP64
    if (uni > 0.0 && !isinf(uni) && !isnan(inter))
    {
        return double(inter) > (double(p.thr) + double(p.half_ulp)) * double(uni);
    }
#endif
    // union 0, negative, inf or NaN (malformed boxes), or no doubles: the quotient itself
    const float q = inter / uni;
    return nan_over != 0 ? !(q <= p.thr) : q > p.thr;
}

void main()
{
    const int i = int(gl_GlobalInvocationID.x);
    const int word = int(gl_GlobalInvocationID.y);
    const int n = int(counter[0]);
    if (i >= n || word >= p.words)
        return;
    const vec4 a = records[2 * i];
    precise float area_a = (a.z - a.x) * (a.w - a.y);
    uint bits = 0u;
    const int j0 = word * 32;
    const int j1 = min(n, j0 + 32);
    for (int j = j0; j < j1; j++)
    {
        const vec4 b = records[2 * j];
        precise float area_b = (b.z - b.x) * (b.w - b.y);
        precise float iw = min(a.z, b.z) - max(a.x, b.x);
        precise float ih = min(a.w, b.w) - max(a.y, b.y);
        const bool apart = a.x > b.z || a.z < b.x || a.y > b.w || a.w < b.y;
        precise float inter = apart ? 0.0 : iw * ih;
        precise float uni = (area_a + area_b) - inter;
        if (over(inter, uni))
            bits |= 1u << uint(j - j0);
    }
    mask[i * p.words + word] = bits;
}
