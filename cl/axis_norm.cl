// Normalisations along axes (engine/ops/axis_norm.py): LogSoftmax, Hardmax, LpNormalization
// along one axis (or the flattened tail of opsets < 13), MeanVarianceNormalization over a set of
// axes. JIT: T the tensor type, T_C its compute type, LOAD_T / STORE_T (cl/common.cl, half too).

// ---- along one axis: X, Y viewed as [outer, A, inner], a work-item per line --------------------
// PARAM(0) A, PARAM(1) inner, PARAM(2) outer * inner.
#define LINE_BEGIN \
    const int gid = get_global_id(0); \
    const int A = PARAM(0), inner = PARAM(1); \
    if (gid >= PARAM(2)) return; \
    const int o = gid / inner; \
    const int base = o * A * inner + (gid - o * inner); \
    const int xo = T_OFF(0) + base, yo = T_OFF(1) + base;
#define X_AT(a) ((T_C)LOAD_T(X, xo + (a) * inner))

#ifdef LOG_SOFTMAX
KERNEL(log_softmax)(OPTIONAL_SHAPE_INFO_ARG __global const T* X, __global T* Y)
{
    LINE_BEGIN
    T_C m = -INFINITY;
    for (int a = 0; a < A; ++a) m = fmax(m, X_AT(a));
    T_C s = 0;
    for (int a = 0; a < A; ++a) s += exp(X_AT(a) - m);
    const T_C ls = log(s);
    // (x - m) - log(s), not x - (m + log(s)): with large x the sum would round away log(s)
    for (int a = 0; a < A; ++a) STORE_T(Y, yo + a * inner, (X_AT(a) - m) - ls);
}
#endif

#ifdef HARDMAX
KERNEL(hardmax)(OPTIONAL_SHAPE_INFO_ARG __global const T* X, __global T* Y)
{
    LINE_BEGIN
    if (A == 0) return;
    // the first maximum, a NaN counting as the largest (numpy's argmax)
    int best = 0;
    T_C bv = X_AT(0);
    for (int a = 1; a < A; ++a) {
        const T_C v = X_AT(a);
        if ((isnan(v) && !isnan(bv)) || v > bv) { best = a; bv = v; }
    }
    for (int a = 0; a < A; ++a) STORE_T(Y, yo + a * inner, a == best ? 1 : 0);
}
#endif

#ifdef LP_NORM
// JIT: LP_P 1 or 2. A zero norm gives 0s (onnx.reference and onnxruntime), not 0 / 0.
KERNEL(lp_norm)(OPTIONAL_SHAPE_INFO_ARG __global const T* X, __global T* Y)
{
    LINE_BEGIN
    T_C s = 0;
    for (int a = 0; a < A; ++a) {
        const T_C v = X_AT(a);
        s += LP_P == 1 ? fabs(v) : v * v;
    }
    const T_C n = LP_P == 1 ? s : sqrt(s);
    for (int a = 0; a < A; ++a) STORE_T(Y, yo + a * inner, n == 0 ? (T_C)0 : X_AT(a) / n);
}
#endif

// ---- MeanVarianceNormalization over a set of axes ---------------------------------------------
// (x - mean) / (sqrt(variance) + EPS) per kept position, the geometry of cl/norm.cl's reduce_mean:
// PARAM(0..2) kept sizes innermost first, PARAM(3..5) their strides, PARAM(6..8) reduced sizes
// outermost first, PARAM(9..11) their strides; PARAM(12) the number of kept positions. Y has X's
// shape, so each value is written at its own offset. The variance is the mean of (x - mean)^2
// (two passes: E[x^2] - mean^2 of the ONNX function can go negative by rounding).
#ifdef MVN
KERNEL(mvn)(OPTIONAL_SHAPE_INFO_ARG __global const T* X, __global T* Y)
{
    const int gid = get_global_id(0);
    if (gid >= PARAM(12)) return;
    int base = 0;
    for (int k = 0, rem = gid; k < 3; rem /= PARAM(k), ++k)
        base += (rem % PARAM(k)) * PARAM(3 + k);
    const int n1 = PARAM(7), n2 = PARAM(8), total = PARAM(6) * n1 * n2;
#define MVN_OFF(j) (base + ((j) / (n1 * n2)) * PARAM(9) + (((j) / n2) % n1) * PARAM(10) + ((j) % n2) * PARAM(11))
    T_C s = 0;
    for (int j = 0; j < total; ++j) s += (T_C)LOAD_T(X, T_OFF(0) + MVN_OFF(j));
    const T_C mean = s / (T_C)total;
    T_C v = 0;
    for (int j = 0; j < total; ++j) {
        const T_C d = (T_C)LOAD_T(X, T_OFF(0) + MVN_OFF(j)) - mean;
        v += d * d;
    }
    const T_C den = sqrt(v / (T_C)total) + (T_C)EPS;
    for (int j = 0; j < total; ++j)
        STORE_T(Y, T_OFF(1) + MVN_OFF(j), ((T_C)LOAD_T(X, T_OFF(0) + MVN_OFF(j)) - mean) / den);
}
#endif
