#version 450
// DetectionOutput (SSD), decode step (between detection_reset and detection_mask): one
// invocation per prior. A prior with a class score (class 0, the background, aside) above
// the confidence threshold is decoded as models/detection.py (ssd_boxes) defines it and
// appended to `records` (slot from an atomic counter; the host sorts), with all its class
// scores in `scores` (fp32, num_class per slot).
// Record of slot s: records[2s] = (xmin, ymin, xmax, ymax), records[2s + 1] = (prior, 0, 0, 0).
// Scores are prior-major (caffe) or class-major (mxnet); the variances are priorbox row 1
// (caffe, at var_offset) or the push constants (mxnet). `precise` keeps the compiler from
// fusing what numpy rounds twice.
layout (local_size_x = 64) in;

layout (binding = 0) readonly buffer loc_blob { sfp loc_data[]; };
layout (binding = 1) readonly buffer conf_blob { sfp conf_data[]; };
layout (binding = 2) readonly buffer prior_blob { sfp prior_data[]; };
layout (binding = 3) buffer counter_blob { uint counter[]; };
layout (binding = 4) writeonly buffer record_blob { vec4 records[]; };
layout (binding = 5) writeonly buffer score_blob { float scores[]; };

layout (push_constant) uniform parameter
{
    int num_prior;
    int num_class;
    int mxnet;       // 1: class-major scores, variances from the push constants
    int var_offset;  // caffe: where priorbox row 1 (the variances) starts
    float conf_thr;
    float var0;
    float var1;
    float var2;
    float var3;
} p;

float score(int i, int c)
{
    return float(buffer_ld1(conf_data, p.mxnet != 0 ? c * p.num_prior + i : i * p.num_class + c));
}

float variance(int i, int k, float given)
{
    return p.mxnet != 0 ? given : float(buffer_ld1(prior_data, p.var_offset + 4 * i + k));
}

void main()
{
    const int i = int(gl_GlobalInvocationID.x);
    if (i >= p.num_prior)
        return;
    bool any = false;
    for (int c = 1; c < p.num_class; c++)
        any = any || score(i, c) > p.conf_thr;
    if (!any)
        return;

    const float x0 = float(buffer_ld1(prior_data, 4 * i));
    const float y0 = float(buffer_ld1(prior_data, 4 * i + 1));
    const float x1 = float(buffer_ld1(prior_data, 4 * i + 2));
    const float y1 = float(buffer_ld1(prior_data, 4 * i + 3));
    precise float pb_w = x1 - x0;
    precise float pb_h = y1 - y0;
    precise float pb_cx = (x0 + x1) * 0.5;
    precise float pb_cy = (y0 + y1) * 0.5;
    precise float cx = variance(i, 0, p.var0) * float(buffer_ld1(loc_data, 4 * i)) * pb_w + pb_cx;
    precise float cy = variance(i, 1, p.var1) * float(buffer_ld1(loc_data, 4 * i + 1)) * pb_h + pb_cy;
    precise float hw = exp(variance(i, 2, p.var2) * float(buffer_ld1(loc_data, 4 * i + 2))) * pb_w * 0.5;
    precise float hh = exp(variance(i, 3, p.var3) * float(buffer_ld1(loc_data, 4 * i + 3))) * pb_h * 0.5;

    const uint slot = atomicAdd(counter[0], 1u);
    records[2 * slot] = vec4(cx - hw, cy - hh, cx + hw, cy + hh);
    records[2 * slot + 1] = vec4(float(i), 0.0, 0.0, 0.0);
    for (int c = 0; c < p.num_class; c++)
        scores[int(slot) * p.num_class + c] = score(i, c);
}
