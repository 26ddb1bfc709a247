// GridSample (engine/ops/grid_sample.py): X [N, C, L_0..L_{S-1}] sampled at the grid's points,
// Grid [N, O..., S] (normalised to -1..1, its last dim in reverse order: x indexes L_{S-1}),
// Y [N, C, O...]; S = 1..3 spatial dims. A work-item per output element, PyTorch's steps (as
// onnx.reference): unnormalise, round (nearest: to even), bring a point outside the borders in
// (border: clamp, reflection: reflect; not for cubic), then sum the taps (1, 2 or 4 per dim), each tap index
// padded on its own (zeros: 0 outside, border: clamped, reflection: reflected, truncated).
// JIT: T/TG X's and Grid's types with LOAD_/STORE_ (cl/common.cl), TC the compute type,
// GS_MODE 0 nearest, 1 linear, 2 cubic; GS_PAD 0 zeros, 1 border, 2 reflection; ALIGN 0/1.
// Tensors: 0 X, 1 Grid, 2 Y. PARAM(0) S, PARAM(1) C, PARAM(2) output points per (n, c).

inline TC gs_reflect(TC x, TC lo, TC hi) {
    const TC rng = hi - lo;
    if (rng <= 0) return lo;
    if (x < lo) {
        const TC dx = lo - x;
        const int n = (int)(dx / rng);
        const TC r = dx - n * rng;
        return (n % 2 == 0) ? lo + r : hi - r;
    }
    if (x > hi) {
        const TC dx = x - hi;
        const int n = (int)(dx / rng);
        const TC r = dx - n * rng;
        return (n % 2 == 0) ? hi - r : lo + r;
    }
    return x;
}

// Keys' cubic convolution weights (a = -0.75) of the 4 taps around a point t past the first
inline void gs_cubic(TC t, TC* w) {
    const TC a = (TC)-0.75f;
    const TC t1 = t + 1, t2 = 1 - t, t3 = 2 - t;
    w[0] = ((a * t1 - 5 * a) * t1 + 8 * a) * t1 - 4 * a;
    w[1] = ((a + 2) * t - (a + 3)) * t * t + 1;
    w[2] = ((a + 2) * t2 - (a + 3)) * t2 * t2 + 1;
    w[3] = ((a * t3 - 5 * a) * t3 + 8 * a) * t3 - 4 * a;
}

#if GS_MODE == 0
#define TAPS 1
#elif GS_MODE == 1
#define TAPS 2
#else
#define TAPS 4
#endif

KERNEL(grid_sample)(OPTIONAL_SHAPE_INFO_ARG __global const T* X, __global const TG* G, __global T* Y)
{
    const int gid = get_global_id(0);
    if (gid >= T_COUNT(2)) return;
    const int S = PARAM(0), C = PARAM(1), P = PARAM(2);
    const int n = gid / (C * P), c = (gid / P) % C, p = gid % P;
    int first[3] = {0, 0, 0}, len[3] = {1, 1, 1};
    TC w[3][4];
    for (int k = 0; k < S; ++k) {
        const int L = T_DIM(0, MAX_RANK - S + k);
        len[k] = L;
        const TC g = (TC)LOAD_TG(G, T_OFF(1) + (n * P + p) * S + (S - 1 - k));
        TC u = ALIGN ? (g + 1) / 2 * (L - 1) : ((g + 1) * L - 1) / 2;
        const TC lo = ALIGN ? 0 : (TC)-0.5f, hi = ALIGN ? (TC)(L - 1) : (TC)L - (TC)0.5f;
#if GS_MODE == 0
        u = rint(u);
#endif
        // cubic pads its taps only (PyTorch, onnxruntime): clamping the point first would
        // move its weights (onnx.reference does so under border; reflection agrees either way)
        if (GS_MODE != 2 && (u < lo || u > hi)) {
#if GS_PAD == 1
            u = clamp(u, (TC)0, (TC)(L - 1));
#elif GS_PAD == 2
            u = gs_reflect(u, lo, hi);
#endif
        }
#if GS_MODE == 0
        first[k] = (int)u;     // truncated, as the reference's cast
        w[k][0] = 1;
#elif GS_MODE == 1
        const TC f = floor(u);
        first[k] = (int)f;
        w[k][0] = 1 - (u - f);
        w[k][1] = u - f;
#else
        const TC f = floor(u);
        first[k] = (int)f - 1;
        gs_cubic(u - f, w[k]);
#endif
    }
    // the taps of the S dims, dim S-1 fastest; out-of-range taps padded per GS_PAD
    int taps = 1;
    for (int k = 0; k < S; ++k) taps *= TAPS;
    const int xbase = T_OFF(0) + (n * C + c) * len[0] * len[1] * len[2];
    TC acc = 0;
    for (int t = 0; t < taps; ++t) {
        TC wt = 1;
        int off = 0, inside = 1;
        for (int k = 0, rem = t; k < S; ++k) {
            const int j = rem % TAPS;
            rem /= TAPS;
            const int L = len[k];
            int i = first[k] + j;
#if GS_PAD == 0
            inside &= i >= 0 && i < L;
#elif GS_PAD == 1
            i = clamp(i, 0, L - 1);
#else
            if (i < 0 || i >= L)
                i = (int)gs_reflect((TC)i, ALIGN ? 0 : (TC)-0.5f, ALIGN ? (TC)(L - 1) : (TC)L - (TC)0.5f);
#endif
            wt *= w[k][j];
            off = off * L + i;
        }
        if (inside) acc += wt * (TC)LOAD_T(X, xbase + off);
    }
    STORE_T(Y, T_OFF(2) + gid, acc);
}
