// GroupNormalization and InstanceNormalization (a group per channel).
// One work-group of WG items per (n, group) row of Cg * S contiguous elements: mean, then the
// variance of (x - mean) (two passes: exact for rows with a large mean), then the output.
// Tensors: 0 X [N, C, spatial...], 1 scale, 2 bias, 3 Y. JIT: T data type, WG, EPS.
// PARAM(0) groups, PARAM(1) channels per group Cg, PARAM(2) spatial size S,
// PARAM(3) 1 when scale/bias hold one value per channel, 0 per group.
inline float row_sum(__local float* red, float v)
{
    const int lid = get_local_id(0);
    red[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = WG / 2; s > 0; s >>= 1) {
        if (lid < s) red[lid] += red[lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float r = red[0];
    barrier(CLK_LOCAL_MEM_FENCE);   // red is reused by the next sum
    return r;
}

KERNEL(group_norm)(OPTIONAL_SHAPE_INFO_ARG __global const T* X, __global const T* Sc,
                   __global const T* B, __global T* Y)
{
    __local float red[WG];
    const int row = get_group_id(0), lid = get_local_id(0);
    const int G = PARAM(0), Cg = PARAM(1), S = PARAM(2);
    const int L = Cg * S, g = row % G;
    const __global T* x = X + T_OFF(0) + row * L;
    float acc = 0.0f;
    for (int i = lid; i < L; i += WG) acc += LOAD_T(x, i);
    const float mean = row_sum(red, acc) / (float)L;
    acc = 0.0f;
    for (int i = lid; i < L; i += WG) {
        const float d = LOAD_T(x, i) - mean;
        acc += d * d;
    }
    const float inv = rsqrt(row_sum(red, acc) / (float)L + EPS);
    for (int i = lid; i < L; i += WG) {
        const int k = PARAM(3) ? g * Cg + i / S : g;
        const float v = (LOAD_T(x, i) - mean) * inv * LOAD_T(Sc, T_OFF(1) + k) + LOAD_T(B, T_OFF(2) + k);
        STORE_T(Y, T_OFF(3) + row * L + i, v);
    }
}
