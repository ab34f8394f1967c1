#version 450
// YoloDetectionOutput (YOLOv2), decode step (one dispatch per input, between detection_reset
// and detection_mask): every (cell, box k) of a (num_box * per_box, h, w) input as
// models/detection.py (yolo_v2_detect) defines it: softmax over the class channels, the
// best class (the first maximum of the probabilities), confidence sigmoid(t_o) * its
// probability; a cell that passes the threshold is decoded and appended to `records` (slot
// from an atomic counter; the host sorts).
// Record of slot s: records[2s] = (xmin, ymin, xmax, ymax),
//                   records[2s + 1] = (label + 1, confidence, anchor index, 0)
// with the anchor index base + (k * h + y) * w + x: the candidate's place in the layer's
// gathering order (input by input, box by box, cells row-major). All arithmetic is float;
// `precise` keeps the compiler from fusing what numpy rounds twice.
layout (local_size_x = 64) in;

layout (binding = 0) readonly buffer bottom_blob { sfp bottom_blob_data[]; };
layout (binding = 1) buffer counter_blob { uint counter[]; };
layout (binding = 2) writeonly buffer record_blob { vec4 records[]; };

layout (push_constant) uniform parameter
{
    int w;
    int h;
    int num_box;
    int num_class;
    int base;
    int per_box;    // channels per box: c / num_box (5 + num_class; the rest unused)
    float conf_thr;
    int unused;
    vec4 bias_w0;   // anchor widths of boxes 0..3, then 4..7 (in cells)
    vec4 bias_w1;
    vec4 bias_h0;   // anchor heights
    vec4 bias_h1;
} p;

float load(int ch, int cell)
{
    return float(buffer_ld1(bottom_blob_data, ch * p.w * p.h + cell));
}

float sigmoid(float x)
{
    precise float d = 1.0 + exp(-x);
    return 1.0 / d;
}

void main()
{
    const int cell = int(gl_GlobalInvocationID.x);
    const int k = int(gl_GlobalInvocationID.y);
    if (cell >= p.w * p.h || k >= p.num_box)
        return;
    const int ch = k * p.per_box;

    float m = load(ch + 5, cell);
    for (int c = 1; c < p.num_class; c++)
        m = max(m, load(ch + 5 + c, cell));
    precise float sum = 0.0;
    for (int c = 0; c < p.num_class; c++)
        sum += exp(load(ch + 5 + c, cell) - m);
    float best = 0.0;
    int label = 0;
    for (int c = 0; c < p.num_class; c++)
    {
        precise float prob = exp(load(ch + 5 + c, cell) - m) / sum;
        if (prob > best)
        {
            best = prob;
            label = c;
        }
    }
    precise float conf = sigmoid(load(ch + 4, cell)) * best;
    if (!(conf >= p.conf_thr))
        return;

    const int y = cell / p.w;
    const int x = cell - y * p.w;
    precise float cx = (float(x) + sigmoid(load(ch, cell))) / float(p.w);
    precise float cy = (float(y) + sigmoid(load(ch + 1, cell))) / float(p.h);
    const float bias_w = k < 4 ? p.bias_w0[k] : p.bias_w1[k - 4];
    const float bias_h = k < 4 ? p.bias_h0[k] : p.bias_h1[k - 4];
    precise float bw = exp(load(ch + 2, cell)) * bias_w / float(p.w);
    precise float bh = exp(load(ch + 3, cell)) * bias_h / float(p.h);
    precise float hw = bw * 0.5;
    precise float hh = bh * 0.5;

    const uint slot = atomicAdd(counter[0], 1u);
    records[2 * slot] = vec4(cx - hw, cy - hh, cx + hw, cy + hh);
    records[2 * slot + 1] = vec4(float(label + 1), conf, float(p.base + k * p.w * p.h + cell), 0.0);
}
