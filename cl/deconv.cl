// ConvTranspose (2-D, NCHW), one work-item per output element: it gathers the input pixels
// whose scattered taps land on it (oy = iy * SY - pad_top + ky * DY), so no atomics are needed.
// Tensors: 0 X [N, C, H, W], 1 W [C, OC / group, KH, KW], [2 B [OC]], then Y [N, OC, OH, OW].
// JIT: T data type (LOAD_T/STORE_T), SY, SX strides, DY, DX dilations, HAS_BIAS.
// PARAM(0) pad top, PARAM(1) pad left, PARAM(2) group.
#if HAS_BIAS
#define DC_Y 3
#else
#define DC_Y 2
#endif
KERNEL(conv_transpose2d)(OPTIONAL_SHAPE_INFO_ARG __global const T* X, __global const T* Wt,
#if HAS_BIAS
                         __global const T* B,
#endif
                         __global T* Y)
{
    const int gid = get_global_id(0);
    if (gid >= T_COUNT(DC_Y)) return;
    const int C = T_DIM(0, 3), H = T_DIM(0, 4), W = T_DIM(0, 5);
    const int OCg = T_DIM(1, 3), KH = T_DIM(1, 4), KW = T_DIM(1, 5);
    const int OC = T_DIM(DC_Y, 3), OH = T_DIM(DC_Y, 4), OW = T_DIM(DC_Y, 5);
    const int ox = gid % OW;
    int t = gid / OW;
    const int oy = t % OH;
    t /= OH;
    const int oc = t % OC, n = t / OC;
    const int Cg = C / PARAM(2), g = oc / OCg, ocg = oc % OCg;
#if HAS_BIAS
    float acc = LOAD_T(B, T_OFF(2) + oc);
#else
    float acc = 0.0f;
#endif
    const __global T* x = X + T_OFF(0) + (n * C + g * Cg) * H * W;
    const __global T* w = Wt + T_OFF(1) + ((g * Cg) * OCg + ocg) * KH * KW;
    for (int ky = 0; ky < KH; ++ky) {
        const int ty = oy + PARAM(0) - ky * DY;
        if (ty < 0 || ty % SY) continue;
        const int iy = ty / SY;
        if (iy >= H) continue;
        for (int kx = 0; kx < KW; ++kx) {
            const int tx = ox + PARAM(1) - kx * DX;
            if (tx < 0 || tx % SX) continue;
            const int ix = tx / SX;
            if (ix >= W) continue;
            for (int c = 0; c < Cg; ++c)
                acc += LOAD_T(x, (c * H + iy) * W + ix) * LOAD_T(w, (c * OCg * KH + ky) * KW + kx);
        }
    }
    STORE_T(Y, T_OFF(DC_Y) + gid, acc);
}
