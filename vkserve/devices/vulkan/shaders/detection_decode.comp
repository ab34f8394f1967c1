#version 450
// Yolov3DetectionOutput, step 2 of 3 (one dispatch per input head): decode every anchor cell
// of a (num_box * (5 + num_class), h, w) head as models/detection.py defines it, and
// append the candidates whose confidence passes the threshold to `records` (slot from an
// atomic counter, so the slot order is arbitrary; the host sorts).
// Record of slot s: records[2s] = (xmin, ymin, xmax, ymax),
//                   records[2s + 1] = (label + 1, confidence, anchor index, 0)
// where the anchor index is the row the layer gives the cell before its sort:
// base (anchors of the earlier heads) + (k * h + y) * w + x. All arithmetic is float;
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
    float net_w;
    float net_h;
    float conf_thr;
    vec4 bias_w0;  // anchor widths of boxes 0..3, then 4..7
    vec4 bias_w1;
    vec4 bias_h0;  // anchor heights
    vec4 bias_h1;
} p;

float load(int ch, int cell)
{
    return float(buffer_ld1(bottom_blob_data, ch * p.w * p.h + cell));
}

void main()
{
    const int cell = int(gl_GlobalInvocationID.x);
    const int k = int(gl_GlobalInvocationID.y);
    if (cell >= p.w * p.h || k >= p.num_box)
        return;
    const int ch = k * (5 + p.num_class);

    // argmax over the class logits: the first maximum, like numpy's argmax
    float m = load(ch + 5, cell);
    int label = 0;
    for (int c = 1; c < p.num_class; c++)
    {
        const float v = load(ch + 5 + c, cell);
        if (v > m)
        {
            m = v;
            label = c;
        }
    }
    // ncnn's expression: 1 / (1 + exp(-box) * (1 + exp(-class)))
    precise float conf = 1.0 / (1.0 + exp(-load(ch + 4, cell)) * (1.0 + exp(-m)));
    if (!(conf >= p.conf_thr))
        return;

    const int y = cell / p.w;
    const int x = cell - y * p.w;
    precise float sx = 1.0 / (1.0 + exp(-load(ch, cell)));
    precise float sy = 1.0 / (1.0 + exp(-load(ch + 1, cell)));
    precise float cx = (float(x) + sx) / float(p.w);
    precise float cy = (float(y) + sy) / float(p.h);
    const float bias_w = k < 4 ? p.bias_w0[k] : p.bias_w1[k - 4];
    const float bias_h = k < 4 ? p.bias_h0[k] : p.bias_h1[k - 4];
    precise float bw = exp(load(ch + 2, cell)) * bias_w / p.net_w;
    precise float bh = exp(load(ch + 3, cell)) * bias_h / p.net_h;
    precise float hw = bw * 0.5;
    precise float hh = bh * 0.5;

    const uint slot = atomicAdd(counter[0], 1u);
    records[2 * slot] = vec4(cx - hw, cy - hh, cx + hw, cy + hh);
    records[2 * slot + 1] = vec4(float(label + 1), conf, float(p.base + k * p.w * p.h + cell), 0.0);
}
