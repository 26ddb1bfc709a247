// Normalisations and reductions: mean reduction, softmax, layer normalization, LRN.
// Every kernel is shape-agnostic: sizes come from shape_info (T_DIM / PARAM).

// ---- mean over a set of axes ---------------------------------------------------------------
// Tensors: 0 X, 1 Y (Y's element order is X's with the reduced dims removed).
// The host merges adjacent dims of the same kind, so X is at most 3 kept groups interleaved
// with at most 3 reduced groups.
// PARAM(0..2): kept group sizes, innermost first; PARAM(3..5): their element strides in X;
// PARAM(6..8): reduced group sizes, outermost first (1 when unused); PARAM(9..11): their strides.
#ifdef REDUCE_MEAN
KERNEL(reduce_mean)(OPTIONAL_SHAPE_INFO_ARG __global const float* X, __global float* Y)
{
    const int gid = get_global_id(0);
    if (gid >= T_COUNT(1)) return;
    int rem = gid, base = T_OFF(0);
    for (int k = 0; k < 3; ++k) {
        const int n = PARAM(k);
        const int i = rem % n;
        rem /= n;
        base += i * PARAM(3 + k);
    }
    const int c0 = PARAM(6), c1 = PARAM(7), c2 = PARAM(8);
    const int s0 = PARAM(9), s1 = PARAM(10), s2 = PARAM(11);
    float acc = 0.0f;
    for (int a = 0; a < c0; ++a) {
        float acc1 = 0.0f;
        for (int b = 0; b < c1; ++b) {
            const __global float* p = X + base + a * s0 + b * s1;
            float acc2 = 0.0f;
            for (int c = 0; c < c2; ++c) acc2 += p[c * s2];
            acc1 += acc2;
        }
        acc += acc1;
    }
    // float division (a NaN for an empty reduction, as numpy's mean)
    Y[T_OFF(1) + gid] = acc / (float)(c0 * c1 * c2);
}
#endif

// ---- softmax -------------------------------------------------------------------------------
// Tensors: 0 X, 1 Y, both viewed as [outer, A, inner]; normalises over A, then the prologue's
// extra inputs (PROLOGUE_ARGS). Every read of X goes through the prologue (e.g. X * scale +
// mask), so a fused Softmax never needs its input materialised.
// PARAM(0) A, PARAM(1) inner, PARAM(2) outer * inner (work-items), PARAM(3) 1 when A is one
// dim of X (the prologue's operand offsets are then linear along a row).
#ifdef SOFTMAX
KERNEL(softmax)(OPTIONAL_SHAPE_INFO_ARG __global const float* X, __global float* Y PROLOGUE_ARGS)
{
    const int gid = get_global_id(0);
    const int A = PARAM(0), inner = PARAM(1);
    if (gid >= PARAM(2)) return;
    const int o = gid / inner;
    const int base = o * A * inner + (gid - o * inner);
    const __global float* x = X + T_OFF(0) + base;
    __global float* y = Y + T_OFF(1) + base;
    PROLOGUE_ROW(base, inner, PARAM(3))
#define SOFTMAX_X(a) PROLOGUE_AT(x[(a) * inner], (a), base + (a) * inner)
    float m = -INFINITY;
    for (int a = 0; a < A; ++a) m = fmax(m, SOFTMAX_X(a));
    float s = 0.0f;
    for (int a = 0; a < A; ++a) {
        const float e = exp(SOFTMAX_X(a) - m);
        y[a * inner] = e;
        s += e;
    }
#undef SOFTMAX_X
    const float inv = 1.0f / s;
    for (int a = 0; a < A; ++a) y[a * inner] *= inv;
}
#endif

// ---- layer normalization -------------------------------------------------------------------
// Tensors: 0 X [rows, D], 1 Scale, [2 B], then Y. JIT: EPS, HAS_BIAS.
// PARAM(0) rows, PARAM(1) D, PARAM(2) Scale's element count, PARAM(3) B's element count
// (Scale and B broadcast to the normalised dims as a suffix: index j % count).
#ifdef LAYER_NORM
#if HAS_BIAS
#define LN_Y 3
#else
#define LN_Y 2
#endif
KERNEL(layer_norm)(OPTIONAL_SHAPE_INFO_ARG __global const float* X, __global const float* S,
#if HAS_BIAS
                   __global const float* B,
#endif
                   __global float* Y)
{
    const int row = get_global_id(0);
    const int D = PARAM(1), sc = PARAM(2);
    if (row >= PARAM(0)) return;
    const __global float* x = X + T_OFF(0) + row * D;
    __global float* y = Y + T_OFF(LN_Y) + row * D;
    const __global float* s = S + T_OFF(1);
    float sum = 0.0f;
    for (int j = 0; j < D; ++j) sum += x[j];
    const float mean = sum / (float)D;
    float sq = 0.0f;
    for (int j = 0; j < D; ++j) {
        const float d = x[j] - mean;
        sq += d * d;
    }
    const float inv = rsqrt(sq / (float)D + EPS);
#if HAS_BIAS
    const __global float* b = B + T_OFF(2);
    const int bc = PARAM(3);
    if (sc == D && bc == D) {
        for (int j = 0; j < D; ++j) y[j] = (x[j] - mean) * inv * s[j] + b[j];
    } else {
        for (int j = 0; j < D; ++j) y[j] = (x[j] - mean) * inv * s[j % sc] + b[j % bc];
    }
#else
    if (sc == D) {
        for (int j = 0; j < D; ++j) y[j] = (x[j] - mean) * inv * s[j];
    } else {
        for (int j = 0; j < D; ++j) y[j] = (x[j] - mean) * inv * s[j % sc];
    }
#endif
}
#endif

// ---- local response normalization (across channels) ---------------------------------------
// Tensors: 0 X [N, C, ...], 1 Y. JIT: LRN_SIZE, LRN_ALPHA, LRN_BETA, LRN_BIAS.
// PARAM(0) C, PARAM(1) spatial size (product of the dims after C).
#ifdef LRN
KERNEL(lrn)(OPTIONAL_SHAPE_INFO_ARG __global const float* X, __global float* Y)
{
    const int gid = get_global_id(0);
    if (gid >= T_COUNT(1)) return;
    const int C = PARAM(0), S = PARAM(1);
    const int c = (gid / S) % C;
    const int lo = max(c - (LRN_SIZE - 1) / 2, 0);
    const int hi = min(c + LRN_SIZE / 2, C - 1);
    const __global float* x = X + T_OFF(0) + gid;
    float sq = 0.0f;
    for (int k = lo - c; k <= hi - c; ++k) {
        const float v = x[k * S];
        sq += v * v;
    }
    const float base = LRN_BIAS + (LRN_ALPHA / (float)LRN_SIZE) * sq;
    Y[T_OFF(1) + gid] = x[0] / pow(base, LRN_BETA);
}
#endif

// ---- batch normalization (inference) -------------------------------------------------------
// Tensors: 0 X [N, C, spatial...], 1 scale, 2 B, 3 mean, 4 var (all [C]), 5 Y. JIT: EPS.
// PARAM(0) C, PARAM(1) spatial size, PARAM(2) element count. One work-item per element.
#ifdef BATCH_NORM
KERNEL(batch_norm)(OPTIONAL_SHAPE_INFO_ARG __global const float* X, __global const float* S,
                   __global const float* B, __global const float* M, __global const float* V,
                   __global float* Y)
{
    const int i = get_global_id(0);
    if (i >= PARAM(2)) return;
    const int c = (i / PARAM(1)) % PARAM(0);
    const float k = S[T_OFF(1) + c] * rsqrt(V[T_OFF(4) + c] + EPS);
    Y[T_OFF(5) + i] = (X[T_OFF(0) + i] - M[T_OFF(3) + c]) * k + B[T_OFF(2) + c];
}
#endif
