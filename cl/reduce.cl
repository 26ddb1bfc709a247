// Reductions other than the mean (cl/norm.cl has it): ReduceSum/Max/Min/Prod/L2, ArgMax/ArgMin,
// CumSum. JIT: T input type, TOUT output type, TACC accumulator type.

// ---- reduce over a set of axes ---------------------------------------------------------------
// Same geometry as norm.cl's reduce_mean (the host merges dims: 3 kept groups, 3 reduced).
// JIT: REDUCE_INIT(acc) the empty result, REDUCE_ACC(acc, v), REDUCE_FINAL(acc).
// Tensors: 0 X, 1 Y. PARAM(0..2) kept sizes innermost first, PARAM(3..5) their strides,
// PARAM(6..8) reduced sizes outermost first, PARAM(9..11) their strides.
#ifdef REDUCE
KERNEL(reduce)(OPTIONAL_SHAPE_INFO_ARG __global const T* X, __global TOUT* Y)
{
    const int gid = get_global_id(0);
    if (gid >= T_COUNT(1)) return;
    int base = T_OFF(0);
    for (int k = 0, rem = gid; k < 3; rem /= PARAM(k), ++k)
        base += (rem % PARAM(k)) * PARAM(3 + k);
    // the reduced groups walked as one flat range (outermost group slowest)
    const int n1 = PARAM(7), n2 = PARAM(8), total = PARAM(6) * n1 * n2;
    TACC acc;
    REDUCE_INIT(acc);
    for (int j = 0; j < total; ++j) {
        const int c = j % n2, b = (j / n2) % n1, a = j / (n1 * n2);
        const TACC v = (TACC)X[base + a * PARAM(9) + b * PARAM(10) + c * PARAM(11)];
        REDUCE_ACC(acc, v);
    }
    Y[T_OFF(1) + gid] = (TOUT)(REDUCE_FINAL(acc));
}
#endif

// ---- ArgMax / ArgMin along one axis ----------------------------------------------------------
// X viewed as [outer, A, inner]; Y [outer, inner] int64. JIT: BETTER(v, best) when v replaces
// the best so far (strict for the first index, >= for select_last_index; NaN wins as numpy).
// PARAM(0) A, PARAM(1) inner, PARAM(2) outer * inner.
#ifdef ARG_REDUCE
KERNEL(arg_reduce)(OPTIONAL_SHAPE_INFO_ARG __global const T* X, __global long* Y)
{
    const int gid = get_global_id(0);
    const int A = PARAM(0), inner = PARAM(1);
    if (gid >= PARAM(2)) return;
    const int o = gid / inner;
    const __global T* x = X + T_OFF(0) + o * A * inner + (gid - o * inner);
    T best = x[0];
    long at = 0;
    for (int a = 1; a < A; ++a) {
        const T v = x[a * inner];
        if (BETTER(v, best)) { best = v; at = a; }
    }
    Y[T_OFF(1) + gid] = at;
}
#endif

// ---- CumSum (CumProd) along one axis ---------------------------------------------------------
// X, Y viewed as [outer, A, inner]. JIT: EXCLUSIVE, REVERSE (0/1); CUM_PRODUCT 1: products.
// PARAM(0) A, PARAM(1) inner. Each work-item sums its own prefix: O(A^2) work, no sync.
#ifdef CUMSUM
#ifndef CUM_PRODUCT
#define CUM_PRODUCT 0
#endif
KERNEL(cumsum)(OPTIONAL_SHAPE_INFO_ARG __global const T* X, __global T* Y)
{
    const int gid = get_global_id(0);
    if (gid >= T_COUNT(1)) return;
    const int A = PARAM(0), inner = PARAM(1);
    const int j = (gid / inner) % A;
    const int row = gid - j * inner;       // element 0 of this one's line
    int lo = REVERSE ? j : 0, hi = REVERSE ? A - 1 : j;
    if (EXCLUSIVE) { if (REVERSE) ++lo; else --hi; }
    T acc = CUM_PRODUCT ? 1 : 0;
    for (int a = lo; a <= hi; ++a) {
        const T v = X[T_OFF(0) + row + a * inner];
        acc = CUM_PRODUCT ? acc * v : acc + v;
    }
    Y[T_OFF(1) + gid] = acc;
}
#endif

// ---- per-row mean and 1 / sqrt(variance + EPS) (LayerNormalization's Mean and InvStdDev) ------
// Tensors: 0 X viewed as [rows, D], 1 mean [rows], 2 inv_std [rows]. PARAM(0) rows, PARAM(1) D.
#ifdef ROW_STATS
KERNEL(row_stats)(OPTIONAL_SHAPE_INFO_ARG __global const float* X, __global float* mean,
                  __global float* inv_std)
{
    const int r = get_global_id(0);
    if (r >= PARAM(0)) return;
    const int D = PARAM(1);
    const __global float* x = X + T_OFF(0) + r * D;
    float s = 0.0f;
    for (int i = 0; i < D; ++i) s += x[i];
    const float m = s / (float)D;
    float v = 0.0f;
    for (int i = 0; i < D; ++i) v += (x[i] - m) * (x[i] - m);
    mean[T_OFF(1) + r] = m;
    inv_std[T_OFF(2) + r] = 1.0f / sqrt(v / (float)D + EPS);
}
#endif
