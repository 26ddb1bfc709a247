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
    if (inner == 1) {   // a contiguous row: float8 (explicit SIMD, PoCL's vector exp), then a tail
#if HAS_PROLOGUE
        // the prologue (scores * scale + mask) once, into this row of Y; then read from there
        for (int a = 0; a < A; ++a) y[a] = PROLOGUE_AT(x[a], a, base + a);
        const __global float* xr = y;
#else
        const __global float* xr = x;
#endif
        const int A8 = A & ~7;
        float8 m8 = -INFINITY;
        for (int a = 0; a < A8; a += 8) m8 = fmax(m8, VLOADU(8, xr + a));
        float m = fmax(fmax(fmax(m8.s0, m8.s1), fmax(m8.s2, m8.s3)),
                       fmax(fmax(m8.s4, m8.s5), fmax(m8.s6, m8.s7)));
        for (int a = A8; a < A; ++a) m = fmax(m, xr[a]);
        float8 s8 = 0.0f;
        for (int a = 0; a < A8; a += 8) {
            const float8 e = exp(VLOADU(8, xr + a) - m);
            VSTOREU(8, e, y + a);
            s8 += e;
        }
        float s = s8.s0 + s8.s1 + s8.s2 + s8.s3 + s8.s4 + s8.s5 + s8.s6 + s8.s7;
        for (int a = A8; a < A; ++a) {
            const float e = exp(xr[a] - m);
            y[a] = e;
            s += e;
        }
        const float inv = 1.0f / s;
        for (int a = 0; a < A8; a += 8) VSTOREU(8, VLOADU(8, y + a) * inv, y + a);
        for (int a = A8; a < A; ++a) y[a] *= inv;
        return;
    }
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

// GPU, rows along the last dim (inner == 1): W lanes per row, NORM_WG / W rows per work-group,
// local reductions of the max and the sum. PARAM(4) W (a power of two). JIT: NORM_WG.
#ifdef SOFTMAX_WG
KERNEL(softmax_wg)(OPTIONAL_SHAPE_INFO_ARG __global const float* X, __global float* Y PROLOGUE_ARGS)
{
    __local float red[NORM_WG];
    const int A = PARAM(0), W = PARAM(4), lid = get_local_id(0), lane = lid & (W - 1);
    const int row = get_group_id(0) * (NORM_WG / W) + lid / W;
    const int live = row < PARAM(2);
    const int base = (live ? row : 0) * A;
    const __global float* x = X + T_OFF(0) + base;
    __global float* y = Y + T_OFF(1) + base;
    PROLOGUE_ROW(base, 1, PARAM(3))
#define SOFTMAX_X(a) PROLOGUE_AT(x[a], (a), base + (a))
    if (A <= ROW_PER_LANE * W) {   // the row in registers: one read of X, one write of Y
        float v[ROW_PER_LANE];
        float m = -INFINITY;
#pragma unroll
        for (int k = 0; k < ROW_PER_LANE; ++k) {
            const int a = lane + k * W;
            v[k] = a < A ? SOFTMAX_X(a) : -INFINITY;
            m = fmax(m, v[k]);
        }
        m = lanes_reduce(red, lid, lane, W, m, 1);
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < ROW_PER_LANE; ++k) {
            v[k] = lane + k * W < A ? exp(v[k] - m) : 0.0f;
            s += v[k];
        }
        const float inv = 1.0f / lanes_reduce(red, lid, lane, W, s, 0);
        if (live) {
#pragma unroll
            for (int k = 0; k < ROW_PER_LANE; ++k)
                if (lane + k * W < A) y[lane + k * W] = v[k] * inv;
        }
        return;
    }
    float m = -INFINITY;
    for (int a = lane; a < A; a += W) m = fmax(m, SOFTMAX_X(a));
    m = lanes_reduce(red, lid, lane, W, m, 1);
    float s = 0.0f;
    for (int a = lane; a < A; a += W) {
        const float e = exp(SOFTMAX_X(a) - m);
        if (live) y[a] = e;
        s += e;
    }
#undef SOFTMAX_X
    const float inv = 1.0f / lanes_reduce(red, lid, lane, W, s, 0);
    if (live)
        for (int a = lane; a < A; a += W) y[a] *= inv;   // the lane's own stores: no barrier
}
#endif

// ---- layer normalization -------------------------------------------------------------------
// Tensors: 0 X [rows, D], 1 Scale, [2 B], then Y, then the prologue's extra inputs (e.g. the
// residual r of LN(x + r): every read of X goes through PROLOGUE_AT, engine/fusion.py).
// JIT: EPS, HAS_BIAS. PARAM(0) rows, PARAM(1) D, PARAM(2) Scale's element count, PARAM(3) B's
// element count (Scale and B broadcast to the normalised dims as a suffix: index j % count),
// PARAM(4) 1 when a row runs along one dim (prologue offsets linear), PARAM(5) lanes per row
// (layer_norm_wg).
#ifdef LAYER_NORM
#if HAS_BIAS
#define LN_Y 3
#define LN_B_ARG __global const float* B,
#define LN_BIAS(j) (bc == D ? b[j] : b[(j) % bc])
#else
#define LN_Y 2
#define LN_B_ARG
#define LN_BIAS(j) 0.0f
#endif
#define LN_X(j) PROLOGUE_AT(x[j], (j), base + (j))
#define LN_SCALE(j) (sc == D ? s[j] : s[(j) % sc])

// CPU: a work-item per row, no barriers (PoCL runs barriers as loops over the work-group).
#ifndef NORM_WG
KERNEL(layer_norm)(OPTIONAL_SHAPE_INFO_ARG __global const float* X, __global const float* S,
                   LN_B_ARG __global float* Y PROLOGUE_ARGS)
{
    const int row = get_global_id(0);
    const int D = PARAM(1), sc = PARAM(2), bc = PARAM(3);
    if (row >= PARAM(0)) return;
    const int base = row * D;
    const __global float* x = X + T_OFF(0) + base;
    __global float* y = Y + T_OFF(LN_Y) + base;
    const __global float* s = S + T_OFF(1);
#if HAS_BIAS
    const __global float* b = B + T_OFF(2);
#endif
    PROLOGUE_ROW(base, 1, PARAM(4))
#if HAS_PROLOGUE
    // the prologue (x + r, ...) once, into this row of Y; the passes below read it from there
    for (int j = 0; j < D; ++j) y[j] = LN_X(j);
    const __global float* xr = y;
#else
    const __global float* xr = x;
#endif
    // the first D8 elements as float8 (explicit SIMD: PoCL does not vectorise a float
    // reduction loop on its own), the rest one by one. PoCL, 2 shared cores, 2048x384
    // (scripts/bench_norm.py): scalar 1339 us, float4 400 us, float8 210 us.
    const int D8 = D & ~7;
    float8 sum8 = 0.0f;
    for (int j = 0; j < D8; j += 8) sum8 += VLOADU(8, xr + j);
    float sum = sum8.s0 + sum8.s1 + sum8.s2 + sum8.s3 + sum8.s4 + sum8.s5 + sum8.s6 + sum8.s7;
    for (int j = D8; j < D; ++j) sum += xr[j];
    const float mean = sum / (float)D;
    float8 sq8 = 0.0f;
    for (int j = 0; j < D8; j += 8) {
        const float8 d = VLOADU(8, xr + j) - mean;
        sq8 += d * d;
    }
    float sq = sq8.s0 + sq8.s1 + sq8.s2 + sq8.s3 + sq8.s4 + sq8.s5 + sq8.s6 + sq8.s7;
    for (int j = D8; j < D; ++j) {
        const float d = xr[j] - mean;
        sq += d * d;
    }
    const float inv = rsqrt(sq / (float)D + EPS);
    if (sc == D && (!HAS_BIAS || bc == D)) {
        for (int j = 0; j < D8; j += 8) {
#if HAS_BIAS
            const float8 bj = VLOADU(8, b + j);
#else
            const float8 bj = 0.0f;
#endif
            VSTOREU(8, (VLOADU(8, xr + j) - mean) * inv * VLOADU(8, s + j) + bj, y + j);
        }
        for (int j = D8; j < D; ++j) y[j] = (xr[j] - mean) * inv * LN_SCALE(j) + LN_BIAS(j);
    } else {
        for (int j = 0; j < D; ++j) y[j] = (xr[j] - mean) * inv * LN_SCALE(j) + LN_BIAS(j);
    }
}
#else

// GPU: W lanes per row, NORM_WG / W rows per work-group; lane k reads elements k, k + W, ...
// (consecutive lanes read consecutive floats: coalesced); two local reductions (mean, then the
// squared deviations: the second read of the row comes from cache). JIT: NORM_WG.
KERNEL(layer_norm_wg)(OPTIONAL_SHAPE_INFO_ARG __global const float* X, __global const float* S,
                      LN_B_ARG __global float* Y PROLOGUE_ARGS)
{
    __local float red[NORM_WG];
    const int W = PARAM(5), lid = get_local_id(0), lane = lid & (W - 1);
    const int row = get_group_id(0) * (NORM_WG / W) + lid / W;
    const int D = PARAM(1), sc = PARAM(2), bc = PARAM(3);
    const int live = row < PARAM(0);
    const int base = (live ? row : 0) * D;   // spare lanes read row 0 and store nothing
    const __global float* x = X + T_OFF(0) + base;
    __global float* y = Y + T_OFF(LN_Y) + base;
    const __global float* s = S + T_OFF(1);
#if HAS_BIAS
    const __global float* b = B + T_OFF(2);
#endif
    PROLOGUE_ROW(base, 1, PARAM(4))
    if (D <= ROW_PER_LANE * W) {
        // the row fits in registers (ROW_PER_LANE values per lane, row_lanes sizes W for it):
        // one read of X, the statistics and the output from the registers
        float v[ROW_PER_LANE];
        float sum = 0.0f;
#pragma unroll
        for (int k = 0; k < ROW_PER_LANE; ++k) {
            const int j = lane + k * W;
            v[k] = j < D ? LN_X(j) : 0.0f;
            sum += v[k];
        }
        const float mean = lanes_reduce(red, lid, lane, W, sum, 0) / (float)D;
        float sq = 0.0f;
#pragma unroll
        for (int k = 0; k < ROW_PER_LANE; ++k) {
            const float d = lane + k * W < D ? v[k] - mean : 0.0f;
            sq += d * d;
        }
        const float inv = rsqrt(lanes_reduce(red, lid, lane, W, sq, 0) / (float)D + EPS);
        if (live) {
#pragma unroll
            for (int k = 0; k < ROW_PER_LANE; ++k) {
                const int j = lane + k * W;
                if (j < D) y[j] = (v[k] - mean) * inv * LN_SCALE(j) + LN_BIAS(j);
            }
        }
        return;
    }
    float sum = 0.0f;   // longer rows: the second and third reads come from cache
    for (int j = lane; j < D; j += W) sum += LN_X(j);
    const float mean = lanes_reduce(red, lid, lane, W, sum, 0) / (float)D;
    float sq = 0.0f;
    for (int j = lane; j < D; j += W) {
        const float d = LN_X(j) - mean;
        sq += d * d;
    }
    const float inv = rsqrt(lanes_reduce(red, lid, lane, W, sq, 0) / (float)D + EPS);
    if (live)
        for (int j = lane; j < D; j += W) y[j] = (LN_X(j) - mean) * inv * LN_SCALE(j) + LN_BIAS(j);
}
#endif   // NORM_WG
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
