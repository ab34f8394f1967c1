// The fused activation of a layer's output (shared by #include): the including shader
// declares the specialization constants activation_type, activation_param_0 and _1.
// Types 0-6 are ncnn's (none, ReLU, leaky ReLU, clip, sigmoid, mish, hard-swish); 7 and 8
// are vkserve's, for a GELU layer folded into the layer before it (erf and tanh forms).
#include "fmath.h"

float activate(float v)
{
    if (activation_type == 1)
        return max(v, 0.0);
    if (activation_type == 2)
        return v < 0.0 ? v * activation_param_0 : v;
    if (activation_type == 3)
        return clamp(v, activation_param_0, activation_param_1);
    if (activation_type == 4)
        return 1.0 / (1.0 + exp(-v));
    if (activation_type == 5)
    {
        // x * tanh(softplus(x)); tanh from exp(-2 sp) with sp >= 0 cannot overflow
        float sp = v > 20.0 ? v : log(1.0 + exp(v));
        float t = exp(-2.0 * sp);
        return v * (1.0 - t) / (1.0 + t);
    }
    if (activation_type == 6)
        return v * clamp(v * activation_param_0 + activation_param_1, 0.0, 1.0);
    if (activation_type == 7)
        return 0.5 * v * (1.0 + erf1(v * 0.70710678));
    if (activation_type == 8)
        return 0.5 * v * (1.0 + tanh1(0.79788452 * (v + 0.044715 * v * v * v)));
    return v;
}
