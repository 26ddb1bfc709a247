// 2-D max / average pooling, NCHW. One work-item per output element.
// Tensors: 0 X [N, C, H, W], 1 Y [N, C, OH, OW].
// JIT: T data type (LOAD_T/STORE_T, cl/common.cl), POOL_MAX (1: max, 0: average), COUNT_INCLUDE_PAD (average: divide by the taps inside
//      the padded input instead of the taps inside the input).
// PARAM(0) KH, (1) KW, (2) SY, (3) SX, (4) DY, (5) DX, (6) pad top, (7) pad left,
//      (8) pad bottom, (9) pad right.
inline int first_tap(int start, int lo, int d)   // first k with start + k * d >= lo
{
    return start >= lo ? 0 : (lo - start + d - 1) / d;
}

inline int end_tap(int start, int hi, int k, int d)   // first k with start + k * d >= hi (<= k)
{
    return start >= hi ? 0 : min(k, (hi - start + d - 1) / d);
}

KERNEL(pool2d)(OPTIONAL_SHAPE_INFO_ARG __global const T* X, __global T* Y)
{
    const int H = T_DIM(0, 4), W = T_DIM(0, 5);
    const int OH = T_DIM(1, 4), OW = T_DIM(1, 5);
    const int KH = PARAM(0), KW = PARAM(1), SY = PARAM(2), SX = PARAM(3);
    const int DY = PARAM(4), DX = PARAM(5);
    const int gid = get_global_id(0);
    if (gid >= T_COUNT(1)) return;
    const int ox = gid % OW;
    const int t = gid / OW;
    const int oy = t % OH;
    const int nc = t / OH;
    const int iy0 = oy * SY - PARAM(6), ix0 = ox * SX - PARAM(7);
    const int ky0 = first_tap(iy0, 0, DY), ky1 = end_tap(iy0, H, KH, DY);
    const int kx0 = first_tap(ix0, 0, DX), kx1 = end_tap(ix0, W, KW, DX);
    const __global T* xp = X + T_OFF(0) + nc * H * W;
#if POOL_MAX
    float acc = -INFINITY;
    for (int ky = ky0; ky < ky1; ++ky) {
        const int r = (iy0 + ky * DY) * W + ix0;
        for (int kx = kx0; kx < kx1; ++kx) acc = fmax(acc, LOAD_T(xp, r + kx * DX));
    }
#else
    float acc = 0.0f;
    for (int ky = ky0; ky < ky1; ++ky) {
        const int r = (iy0 + ky * DY) * W + ix0;
        for (int kx = kx0; kx < kx1; ++kx) acc += LOAD_T(xp, r + kx * DX);
    }
#if COUNT_INCLUDE_PAD
    // taps inside the padded extent [-pad_begin, size + pad_end)
    const int ny = end_tap(iy0, H + PARAM(8), KH, DY) - first_tap(iy0, -PARAM(6), DY);
    const int nx = end_tap(ix0, W + PARAM(9), KW, DX) - first_tap(ix0, -PARAM(7), DX);
#else
    const int ny = ky1 - ky0, nx = kx1 - kx0;
#endif
    acc = acc / (float)max(ny * nx, 1);
#endif
    STORE_T(Y, T_OFF(1) + gid, acc);
}
