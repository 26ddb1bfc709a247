// Resize / Upsample, nearest or linear. One work-item per output element.
// Tensors: 0 X, 1 Y (same rank; dims right-aligned to MAX_RANK, leading 1s).
// JIT: T data type (LOAD_T/STORE_T); COORD: 0 half_pixel, 1 asymmetric, 2 align_corners,
// 3 pytorch_half_pixel, 4 tf_half_pixel_for_nn; NEAREST: 0 round_prefer_floor,
// 1 round_prefer_ceil, 2 floor, 3 ceil, 4 simple (opset < 11: floor, ceil when downsampling);
// LINEAR: 1 interpolates the last two dims (the host checks that the others keep their size).
// PARAM(0..5): the scale of each dim (float bits: shape_info holds ints).

// input coordinate of output index x along a dim (in, out: the dim's sizes)
inline float in_coord(int x, float scale, int in, int out)
{
#if COORD == 0
    return ((float)x + 0.5f) / scale - 0.5f;
#elif COORD == 1
    return (float)x / scale;
#elif COORD == 2
    return out == 1 ? 0.0f : (float)x * (float)(in - 1) / (float)(out - 1);
#elif COORD == 3
    return out > 1 ? ((float)x + 0.5f) / scale - 0.5f : 0.0f;
#else
    return ((float)x + 0.5f) / scale;
#endif
}

inline int nearest_index(float c, float scale, int in)
{
#if NEAREST == 0
    const float f = floor(c);
    const int i = (int)(c - f == 0.5f ? f : round(c));
#elif NEAREST == 1
    const float f = floor(c);
    const int i = (int)(c - f == 0.5f ? f + 1.0f : round(c));
#elif NEAREST == 2
    const int i = (int)floor(c);
#elif NEAREST == 3
    const int i = (int)ceil(c);
#else
    const int i = scale < 1.0f ? (int)ceil(c) : (int)c;
#endif
    return clamp(i, 0, in - 1);
}

KERNEL(resize)(OPTIONAL_SHAPE_INFO_ARG __global const T* X, __global T* Y)
{
    const int gid = get_global_id(0);
    if (gid >= T_COUNT(1)) return;
    int rem = gid, src = 0, stride = 1;
#if LINEAR
    int o[MAX_RANK];
    for (int d = MAX_RANK - 1; d >= 0; --d) {
        o[d] = rem % T_DIM(1, d);
        rem /= T_DIM(1, d);
    }
    const int H = T_DIM(0, MAX_RANK - 2), W = T_DIM(0, MAX_RANK - 1);
    stride = H * W;
    for (int d = MAX_RANK - 3; d >= 0; --d) {   // kept dims: same index
        src += o[d] * stride;
        stride *= T_DIM(0, d);
    }
    const float cy = clamp(in_coord(o[MAX_RANK - 2], as_float(PARAM(MAX_RANK - 2)), H,
                                    T_DIM(1, MAX_RANK - 2)), 0.0f, (float)(H - 1));
    const float cx = clamp(in_coord(o[MAX_RANK - 1], as_float(PARAM(MAX_RANK - 1)), W,
                                    T_DIM(1, MAX_RANK - 1)), 0.0f, (float)(W - 1));
    const int y0 = (int)cy, x0 = (int)cx;
    const int y1 = min(y0 + 1, H - 1), x1 = min(x0 + 1, W - 1);
    const float fy = cy - (float)y0, fx = cx - (float)x0;
    const __global T* p = X + T_OFF(0) + src;
    const float top = LOAD_T(p, y0 * W + x0) * (1.0f - fx) + LOAD_T(p, y0 * W + x1) * fx;
    const float bot = LOAD_T(p, y1 * W + x0) * (1.0f - fx) + LOAD_T(p, y1 * W + x1) * fx;
    STORE_T(Y, T_OFF(1) + gid, top * (1.0f - fy) + bot * fy);
#else
    for (int d = MAX_RANK - 1; d >= 0; --d) {
        const int n = T_DIM(1, d), in = T_DIM(0, d);
        const int x = rem % n;
        rem /= n;
        const float scale = as_float(PARAM(d));
        src += nearest_index(in_coord(x, scale, in, n), scale, in) * stride;
        stride *= in;
    }
    STORE_T(Y, T_OFF(1) + gid, LOAD_T(X, T_OFF(0) + src));
#endif
}
