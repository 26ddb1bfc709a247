// Max / average pooling over 1, 2 or 3 spatial dims, one work-item per output element. 1-D and
// 2-D pooling run as 3-D with unit leading spatial dims (engine/ops/pool.py gives the views).
// Tensors: 0 X [N, C, D, H, W], 1 Y [N, C, OD, OH, OW], with WITH_INDICES 2 I (int64, Y's
// shape): the index of each max in X flattened (N and C included), the spatial part row-major
// (STORAGE_ORDER 0) or column-major (1), the first max in row-major scan order on ties.
// JIT: T data type (LOAD_T/STORE_T, cl/common.cl; float, half, char, uchar: all exact in the
//      float accumulator of a max), POOL_MAX (1: max, 0: average), COUNT_INCLUDE_PAD (average:
//      divide by the taps inside the padded input instead of the taps inside the input).
// PARAM(0..2) KD, KH, KW, (3..5) strides, (6..8) dilations, (9..11) pads begin, (12..14) pads
// end, each along D, H, W.
inline int first_tap(int start, int lo, int d)   // first k with start + k * d >= lo
{
    return start >= lo ? 0 : (lo - start + d - 1) / d;
}

inline int end_tap(int start, int hi, int k, int d)   // first k with start + k * d >= hi (<= k)
{
    return start >= hi ? 0 : min(k, (hi - start + d - 1) / d);
}

KERNEL(pool)(OPTIONAL_SHAPE_INFO_ARG __global const T* X, __global T* Y
#if WITH_INDICES
             , __global long* I
#endif
             )
{
    const int D = T_DIM(0, 3), H = T_DIM(0, 4), W = T_DIM(0, 5);
    const int OD = T_DIM(1, 3), OH = T_DIM(1, 4), OW = T_DIM(1, 5);
    const int KD = PARAM(0), KH = PARAM(1), KW = PARAM(2);
    const int SD = PARAM(3), SY = PARAM(4), SX = PARAM(5);
    const int DD = PARAM(6), DY = PARAM(7), DX = PARAM(8);
    const int gid = get_global_id(0);
    if (gid >= T_COUNT(1)) return;
    const int ox = gid % OW;
    int t = gid / OW;
    const int oy = t % OH;
    t /= OH;
    const int oz = t % OD;
    const int nc = t / OD;
    const int iz0 = oz * SD - PARAM(9), iy0 = oy * SY - PARAM(10), ix0 = ox * SX - PARAM(11);
    const int kz0 = first_tap(iz0, 0, DD), kz1 = end_tap(iz0, D, KD, DD);
    const int ky0 = first_tap(iy0, 0, DY), ky1 = end_tap(iy0, H, KH, DY);
    const int kx0 = first_tap(ix0, 0, DX), kx1 = end_tap(ix0, W, KW, DX);
    const __global T* xp = X + T_OFF(0) + nc * D * H * W;
#if POOL_MAX
    float acc = -INFINITY;
#if WITH_INDICES
    int best = -1;
#endif
    for (int kz = kz0; kz < kz1; ++kz) {
        for (int ky = ky0; ky < ky1; ++ky) {
            const int r = ((iz0 + kz * DD) * H + iy0 + ky * DY) * W + ix0;
            for (int kx = kx0; kx < kx1; ++kx) {
                const float v = LOAD_T(xp, r + kx * DX);
#if WITH_INDICES
                if (v > acc || best < 0) {
                    acc = v;
                    best = r + kx * DX;
                }
#else
                acc = fmax(acc, v);
#endif
            }
        }
    }
#if WITH_INDICES
    long idx = best < 0 ? 0 : best;
#if STORAGE_ORDER
    if (best >= 0) {
        const int z = best / (H * W), y = best / W % H, x = best % W;
        idx = z + (y + x * H) * D;
    }
#endif
    I[T_OFF(2) + gid] = (long)nc * D * H * W + idx;
#endif
#else
    float acc = 0.0f;
    for (int kz = kz0; kz < kz1; ++kz) {
        for (int ky = ky0; ky < ky1; ++ky) {
            const int r = ((iz0 + kz * DD) * H + iy0 + ky * DY) * W + ix0;
            for (int kx = kx0; kx < kx1; ++kx) acc += LOAD_T(xp, r + kx * DX);
        }
    }
#if COUNT_INCLUDE_PAD
    // taps inside the padded extent [-pad_begin, size + pad_end)
    const int nz = end_tap(iz0, D + PARAM(12), KD, DD) - first_tap(iz0, -PARAM(9), DD);
    const int ny = end_tap(iy0, H + PARAM(13), KH, DY) - first_tap(iy0, -PARAM(10), DY);
    const int nx = end_tap(ix0, W + PARAM(14), KW, DX) - first_tap(ix0, -PARAM(11), DX);
#else
    const int nz = kz1 - kz0, ny = ky1 - ky0, nx = kx1 - kx0;
#endif
    acc = acc / (float)max(nz * ny * nx, 1);
#endif
    STORE_T(Y, T_OFF(1) + gid, acc);
}
