// Resize / Upsample, nearest, linear or cubic. One work-item per output element.
// Tensors: 0 X, 1 Y (same rank; dims right-aligned to MAX_RANK, leading 1s).
// JIT: T data type (LOAD_T/STORE_T); COORD: 0 half_pixel, 1 asymmetric, 2 align_corners,
// 3 pytorch_half_pixel, 4 tf_half_pixel_for_nn, 5 half_pixel_symmetric, 6 tf_crop_and_resize
// (coordinates outside the input give EXTRAPOLATION); NEAREST:
// 0 round_prefer_floor, 1 round_prefer_ceil, 2 floor, 3 ceil, 4 simple (opset < 11: floor,
// ceil when downsampling); LINEAR / CUBIC: 1 interpolates the last two dims (the host checks
// that the others keep their size); cubic: CUBIC_A (cubic_coeff_a), EXCLUDE_OUTSIDE;
// ANTIALIAS: linear/cubic filters stretched by 1 / scale when downsampling (ONNX's reference).
// PARAM(0..5): the scale of each dim, PARAM(6..11) / PARAM(12..17): its roi start / end
// (tf_crop_and_resize), all float bits (shape_info holds ints).

// Coordinates near halfway between two pixels are common (nearest rounds them): no fused
// multiply-adds, so they come out as plain float32 arithmetic (onnxruntime, ONNX's reference)
// computes them.
#pragma OPENCL FP_CONTRACT OFF

// a / b correctly rounded: OpenCL lets a float division be off by 2.5 ulp (NVIDIA's is), and
// a nearest-neighbour coordinate that should land exactly on .5 (7 rows from 6) would round
// the other way. One residual step (the residual is exact with fma) restores the rounding.
inline float div_rn(float a, float b)
{
    const float q = a / b;
    return q + fma(-q, b, a) / b;
}

// input coordinate of output index x along a dim (in, out: the dim's sizes; start, end: its roi)
inline float in_coord(int x, float scale, int in, int out, float start, float end)
{
#if COORD == 0
    return div_rn((float)x + 0.5f, scale) - 0.5f;
#elif COORD == 1
    return div_rn((float)x, scale);
#elif COORD == 2
    return out == 1 ? 0.0f : div_rn((float)x * (float)(in - 1), (float)(out - 1));
#elif COORD == 3
    return out > 1 ? div_rn((float)x + 0.5f, scale) - 0.5f : 0.0f;
#elif COORD == 4
    return div_rn((float)x + 0.5f, scale);
#elif COORD == 6
    return out > 1 ? start * (float)(in - 1) + (float)x * (end - start) * (float)(in - 1) / (float)(out - 1)
                   : 0.5f * (start + end) * (float)(in - 1);
#else
    const float adjust = (float)out / (scale * (float)in);
    return (float)in * 0.5f * (1.0f - adjust) + div_rn((float)x + 0.5f, scale) - 0.5f;
#endif
}

#if CUBIC
// the 4 taps' weights around coordinate c (taps floor(c) - 1 .. floor(c) + 2, edge-clamped by
// the caller); EXCLUDE_OUTSIDE drops taps outside [0, n) and renormalises the rest
inline int cubic_weights(float c, int n, float* w)
{
    const int i0 = (int)floor(c);
    const float s = c - (float)i0, A = CUBIC_A;
    const float t0 = s + 1.0f, t2 = 1.0f - s, t3 = 2.0f - s;
    w[0] = ((A * t0 - 5.0f * A) * t0 + 8.0f * A) * t0 - 4.0f * A;
    w[1] = ((A + 2.0f) * s - (A + 3.0f)) * s * s + 1.0f;
    w[2] = ((A + 2.0f) * t2 - (A + 3.0f)) * t2 * t2 + 1.0f;
    w[3] = ((A * t3 - 5.0f * A) * t3 + 8.0f * A) * t3 - 4.0f * A;
#if EXCLUDE_OUTSIDE
    float sum = 0.0f;
    for (int k = 0; k < 4; ++k) {
        if (i0 - 1 + k < 0 || i0 - 1 + k >= n) w[k] = 0.0f;
        sum += w[k];
    }
    for (int k = 0; k < 4; ++k) w[k] = sum != 0.0f ? w[k] / sum : 0.0f;
#endif
    return i0 - 1;
}
#endif

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

#if ANTIALIAS
// the filter at distance t (in filter units): the triangle (linear) or the cubic kernel
inline float aa_weight(float t)
{
    t = fabs(t);
#if CUBIC
    const float A = CUBIC_A;
    if (t <= 1.0f) return ((A + 2.0f) * t - (A + 3.0f)) * t * t + 1.0f;
    if (t < 2.0f) return ((A * t - 5.0f * A) * t + 8.0f * A) * t - 4.0f * A;
    return 0.0f;
#else
    return max(0.0f, 1.0f - t);
#endif
}

// Taps along one dim for input coordinate c: first tap `*i0` (relative to *base), weights
// from aa_weight(s * (i - ratio)); ratio in (0, 1] (an integer c takes the pixel on its left as
// base, as ONNX's reference does). Returns the number of taps.
inline int aa_taps(float c, float scale, int* base, float* ratio, int* i0)
{
#if CUBIC
    const float support = 2.0f;
#else
    const float support = 1.0f;
#endif
    const float s = min(scale, 1.0f);
    int b = (int)floor(c);
    float r = c - (float)b;
    if (r == 0.0f) {
        b -= 1;
        r = 1.0f;
    }
    *base = b;
    *ratio = r;
    *i0 = (int)floor(-support / s) + 1;
    return 2 - 2 * *i0;
}
#endif

// the input coordinate of output index x along dim d (inside the kernel: PARAM reads shape_info)
#define COORD_OF(x, d, in, out) in_coord((x), as_float(PARAM(d)), (in), (out), \
                                         as_float(PARAM(MAX_RANK + (d))), as_float(PARAM(2 * MAX_RANK + (d))))
#if COORD == 6
#define OUTSIDE(c, n) ((c) < 0.0f || (c) > (float)((n) - 1))
#else
#define OUTSIDE(c, n) 0
#endif

KERNEL(resize)(OPTIONAL_SHAPE_INFO_ARG __global const T* X, __global T* Y)
{
    const int gid = get_global_id(0);
    if (gid >= T_COUNT(1)) return;
    int rem = gid, src = 0, stride = 1;
#if LINEAR || CUBIC
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
    const __global T* p = X + T_OFF(0) + src;
    const float ry = COORD_OF(o[MAX_RANK - 2], MAX_RANK - 2, H, T_DIM(1, MAX_RANK - 2));
    const float rx = COORD_OF(o[MAX_RANK - 1], MAX_RANK - 1, W, T_DIM(1, MAX_RANK - 1));
    if (OUTSIDE(ry, H) || OUTSIDE(rx, W)) {
        STORE_T(Y, T_OFF(1) + gid, EXTRAPOLATION);
        return;
    }
#if ANTIALIAS
    const float sy = min(as_float(PARAM(MAX_RANK - 2)), 1.0f), sx = min(as_float(PARAM(MAX_RANK - 1)), 1.0f);
    int by, bx, iy, ix;
    float fy, fx;
    const int ny = aa_taps(ry, sy, &by, &fy, &iy), nx = aa_taps(rx, sx, &bx, &fx, &ix);
    float acc = 0.0f, wy_sum = 0.0f, wx_sum = 0.0f;
    for (int j = ix; j < ix + nx; ++j)
        wx_sum += (EXCLUDE_OUTSIDE && (bx + j < 0 || bx + j >= W)) ? 0.0f : aa_weight(sx * ((float)j - fx));
    for (int i = iy; i < iy + ny; ++i) {
        const int y = by + i;
        const float wy = (EXCLUDE_OUTSIDE && (y < 0 || y >= H)) ? 0.0f : aa_weight(sy * ((float)i - fy));
        if (wy == 0.0f) continue;
        wy_sum += wy;
        const int row = clamp(y, 0, H - 1) * W;
        float r = 0.0f;
        for (int j = ix; j < ix + nx; ++j) {
            const int x = bx + j;
            const float wx = (EXCLUDE_OUTSIDE && (x < 0 || x >= W)) ? 0.0f : aa_weight(sx * ((float)j - fx));
            r += wx * LOAD_T(p, row + clamp(x, 0, W - 1));
        }
        acc += wy * r;
    }
    STORE_T(Y, T_OFF(1) + gid, wy_sum * wx_sum != 0.0f ? acc / (wy_sum * wx_sum) : 0.0f);
#elif CUBIC
    float wy[4], wx[4];
    const int y0 = cubic_weights(ry, H, wy), x0 = cubic_weights(rx, W, wx);
    float acc = 0.0f;
    for (int i = 0; i < 4; ++i) {
        const int y = clamp(y0 + i, 0, H - 1);
        float row = 0.0f;
        for (int j = 0; j < 4; ++j) row += wx[j] * LOAD_T(p, y * W + clamp(x0 + j, 0, W - 1));
        acc += wy[i] * row;
    }
    STORE_T(Y, T_OFF(1) + gid, acc);
#else
    const float cy = clamp(ry, 0.0f, (float)(H - 1)), cx = clamp(rx, 0.0f, (float)(W - 1));
    const int y0 = (int)cy, x0 = (int)cx;
    const int y1 = min(y0 + 1, H - 1), x1 = min(x0 + 1, W - 1);
    const float fy = cy - (float)y0, fx = cx - (float)x0;
    const float top = LOAD_T(p, y0 * W + x0) * (1.0f - fx) + LOAD_T(p, y0 * W + x1) * fx;
    const float bot = LOAD_T(p, y1 * W + x0) * (1.0f - fx) + LOAD_T(p, y1 * W + x1) * fx;
    STORE_T(Y, T_OFF(1) + gid, top * (1.0f - fy) + bot * fy);
#endif
#else
    for (int d = MAX_RANK - 1; d >= 0; --d) {
        const int n = T_DIM(1, d), in = T_DIM(0, d);
        const int x = rem % n;
        rem /= n;
        const float c = COORD_OF(x, d, in, n);
        if (OUTSIDE(c, in)) {
            STORE_T(Y, T_OFF(1) + gid, EXTRAPOLATION);
            return;
        }
        src += nearest_index(c, as_float(PARAM(d)), in) * stride;
        stride *= in;
    }
    STORE_T(Y, T_OFF(1) + gid, LOAD_T(X, T_OFF(0) + src));
#endif
}
