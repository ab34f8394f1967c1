// float math the GLSL built-ins lack or get wrong at the edges (shared by #include)

// Abramowitz & Stegun 7.1.26: |error| < 1.5e-7
float erf1(float x)
{
    const float z = abs(x);
    const float t = 1.0 / (1.0 + 0.3275911 * z);
    const float poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741
                       + t * (-1.453152027 + t * 1.061405429))));
    return sign(x) * (1.0 - poly * exp(-z * z));
}

// tanh without the inf / inf of (e^2x - 1) / (e^2x + 1) for large |x|
float tanh1(float x)
{
    const float e = exp(-2.0 * abs(x));
    return sign(x) * (1.0 - e) / (1.0 + e);
}
