// Fused attention (engine/ops/attention.py): y = softmax(prologue(q . k)) @ v per query row; the
// scores and probabilities stay in private (CPU) or local (GPU) memory.
// Tensors: 0 Q, 1 K, 2 V, 3 Y ([b, h, s, dv] through its strides), 4 the scores' dims (a buffer
// never read: the prologue's broadcast reference), then the prologue's operands (scale, mask).
// PARAM(0..3) Q strides (b, h, s, d), PARAM(4..7) K strides (b, h, l, d), PARAM(8..11) V strides
// (b, h, l, d) (0 along a broadcast batch dim), PARAM(12) b, PARAM(13) h, PARAM(14) s,
// PARAM(15) l (<= MAX_L), PARAM(16) dk, PARAM(17) dv (<= MAX_D), PARAM(18) query rows per
// work-group (GPU), PARAM(19..22) Y strides (b, h, s, d) (a heads merge absorbed: [b, s, h, d]).
// Row r = (b * H + h) * s + i.

// ATT_SCALE: a factor of the dot products (q and k's scalar Muls folded, torch.export's sdpa).
// NAN_GUARD: the graph zeroes NaN probabilities (Where(IsNaN(p), 0, p)): a row whose softmax
// is NaN (every score -inf, or a NaN or +inf score) gets a context of 0: INV_SUM is 0 for it
// and SCALE_OUT stores 0 (the accumulator may hold NaN there).
#ifdef ATT_SCALE
#define SCALED(s) ((s) * ATT_SCALE)
#else
#define SCALED(s) (s)
#endif
#ifdef NAN_GUARD     // (arguments are evaluated twice: pass variables)
#define ROW_MAX(m) ((m) == -INFINITY ? 0.0f : (m))
#define INV_SUM(s) ((s) > 0.0f && isfinite(s) ? 1.0f / (s) : 0.0f)
#define SCALE_OUT(acc, inv) ((inv) == 0.0f ? 0.0f : (acc) * (inv))
#define SCALE_OUT8(acc, inv) ((inv) == 0.0f ? (float8)(0.0f) : (acc) * (inv))
#define SCALE_OUT4(acc, inv) ((inv) == 0.0f ? (float4)(0.0f) : (acc) * (inv))
#else
#define ROW_MAX(m) (m)
#define INV_SUM(s) (1.0f / (s))
#define SCALE_OUT(acc, inv) ((acc) * (inv))
#define SCALE_OUT8(acc, inv) ((acc) * (inv))
#define SCALE_OUT4(acc, inv) ((acc) * (inv))
#endif

// KV_APPEND (engine/load_passes.kv_into_attention): K and V are KV caches whose keys from
// P = PARAM(23) on are still in the new tensors KN, VN (tensors KN_T, VN_T; (b, h, l, d) strides
// PARAM(24..27), PARAM(28..31)): they are read from there, and the first query row (block) of
// each (b, h) writes them into the caches. No read of this kernel touches a cache row past P.
#ifdef KV_APPEND
#define KV_CONST
#define KV_ARGS , __global const float* KN, __global const float* VN
#define KV_SETUP(b_, h_) \
    const int P = PARAM(23), knl = PARAM(26), knd = PARAM(27), vnl = PARAM(30), vnd = PARAM(31); \
    const __global float* kn = KN + T_OFF(KN_T) + (b_) * PARAM(24) + (h_) * PARAM(25); \
    const __global float* vn = VN + T_OFF(VN_T) + (b_) * PARAM(28) + (h_) * PARAM(29);
#define K_ROW(j) ((j) < P ? k + (j) * kl : kn + ((j) - P) * knl)
#define V_ROW(j) ((j) < P ? v + (j) * vl : vn + ((j) - P) * vnl)
#define K_D(j) ((j) < P ? kd : knd)
#define V_D(j) ((j) < P ? vd : vnd)
#define KV_UNIT (knd == 1 && vnd == 1)
// lanes `lane` of `lanes` copy the new entries of (b_, h_) into the caches
#define KV_WRITE(b_, h_, lane, lanes) { \
    __global float* kw = K + T_OFF(1) + (b_) * PARAM(4) + (h_) * PARAM(5); \
    __global float* vw = V + T_OFF(2) + (b_) * PARAM(8) + (h_) * PARAM(9); \
    for (int t = (lane); t < (L - P) * Dk; t += (lanes)) \
        kw[(P + t / Dk) * kl + (t % Dk) * kd] = kn[(t / Dk) * knl + (t % Dk) * knd]; \
    for (int t = (lane); t < (L - P) * Dv; t += (lanes)) \
        vw[(P + t / Dv) * vl + (t % Dv) * vd] = vn[(t / Dv) * vnl + (t % Dv) * vnd]; }
#else
#define KV_CONST const
#define KV_ARGS
#define KV_SETUP(b_, h_)
#define K_ROW(j) (k + (j) * kl)
#define V_ROW(j) (v + (j) * vl)
#define K_D(j) kd
#define V_D(j) vd
#define KV_UNIT 1
#define KV_WRITE(b_, h_, lane, lanes) {}
#endif

#define ATT_ARGS OPTIONAL_SHAPE_INFO_ARG __global const float* Q, __global KV_CONST float* K, \
    __global KV_CONST float* V, __global float* Y, __global const float* scores_dims PROLOGUE_ARGS \
    KV_ARGS

// Pointers to row r's q row, k and v (head base) and y row.
#define ATT_SETUP(r) \
    const int H = PARAM(13), S = PARAM(14), L = PARAM(15), Dk = PARAM(16), Dv = PARAM(17); \
    const int i_ = (r) % S, bh_ = (r) / S, h_ = bh_ % H, b_ = bh_ / H; \
    const __global float* q = Q + T_OFF(0) + b_ * PARAM(0) + h_ * PARAM(1) + i_ * PARAM(2); \
    const __global float* k = K + T_OFF(1) + b_ * PARAM(4) + h_ * PARAM(5); \
    const __global float* v = V + T_OFF(2) + b_ * PARAM(8) + h_ * PARAM(9); \
    __global float* y = Y + T_OFF(3) + b_ * PARAM(19) + h_ * PARAM(20) + i_ * PARAM(21); \
    const int qd = PARAM(3), kl = PARAM(6), kd = PARAM(7), vl = PARAM(10), vd = PARAM(11); \
    const int yd = PARAM(22); \
    const int base = (r) * L; \
    KV_SETUP(b_, h_)

// CPU: a work-item per query row, no barriers.
#ifdef ATTENTION_ROW
KERNEL(attention_row)(ATT_ARGS)
{
    const int r = get_global_id(0);
    if (r >= PARAM(12) * PARAM(13) * PARAM(14)) return;
    ATT_SETUP(r)
    if (i_ == 0) KV_WRITE(b_, h_, 0, 1)
    PROLOGUE_ROW(base, 1, 1)
    float sc[MAX_L];
    float m = -INFINITY;
    if (qd == 1 && kd == 1 && vd == 1 && yd == 1 && KV_UNIT && (Dk & 7) == 0 && (Dv & 7) == 0) {
        // contiguous head dims (k's Transpose absorbed): float8 dot products and a float8
        // accumulator row (explicit SIMD; PoCL does not vectorise the float reductions); 4-byte
        // aligned vector types, not vload8 (PoCL calls it out of line: 6.55 -> 4.52 ms, 2 layers)
        float8 qv[MAX_D / 8], acc[MAX_D / 8];
        for (int c = 0; c < Dk / 8; ++c) qv[c] = VLOADU(8, q + 8 * c);
        for (int j = 0; j < L; ++j) {
            const __global float* kj = K_ROW(j);
            float8 s8 = 0.0f;
            for (int c = 0; c < Dk / 8; ++c) s8 += qv[c] * VLOADU(8, kj + 8 * c);
            float s = s8.s0 + s8.s1 + s8.s2 + s8.s3 + s8.s4 + s8.s5 + s8.s6 + s8.s7;
            s = PROLOGUE_AT(SCALED(s), j, base + j);
            sc[j] = s;
            m = fmax(m, s);
        }
        m = ROW_MAX(m);
        float sum = 0.0f;
        for (int c = 0; c < Dv / 8; ++c) acc[c] = 0.0f;
        for (int j = 0; j < L; ++j) {
            const float e = exp(sc[j] - m);
            sum += e;
            const __global float* vj = V_ROW(j);
            for (int c = 0; c < Dv / 8; ++c) acc[c] += e * VLOADU(8, vj + 8 * c);
        }
        const float inv = INV_SUM(sum);
        for (int c = 0; c < Dv / 8; ++c) VSTOREU(8, SCALE_OUT8(acc[c], inv), y + 8 * c);
        return;
    }
    for (int j = 0; j < L; ++j) {
        const __global float* kj = K_ROW(j);
        const int kdj = K_D(j);
        float s = 0.0f;
        for (int d = 0; d < Dk; ++d) s += q[d * qd] * kj[d * kdj];
        s = PROLOGUE_AT(SCALED(s), j, base + j);
        sc[j] = s;
        m = fmax(m, s);
    }
    m = ROW_MAX(m);
    float sum = 0.0f;
    for (int j = 0; j < L; ++j) {
        const float e = exp(sc[j] - m);
        sc[j] = e;
        sum += e;
    }
    const float inv = INV_SUM(sum);
    for (int d = 0; d < Dv; ++d) {
        float acc = 0.0f;
        for (int j = 0; j < L; ++j) acc += sc[j] * V_ROW(j)[d * V_D(j)];
        y[d * yd] = SCALE_OUT(acc, inv);
    }
}
#endif

// GPU: a work-group of ATTENTION_WG lanes per block of R query rows of one (b, h) (R = PARAM(18),
// a power of two <= ATT_ROWS): k and v are read once per block, not once per row. Lanes split
// the keys for the raw scores (the q rows in local memory); then ATTENTION_WG / R lanes per row
// apply the prologue and the softmax (local reductions); then lanes split (d, keys) for the
// output (consecutive lanes read consecutive v elements), R sums per lane.
#ifdef ATTENTION_WG
KERNEL(attention_wg)(ATT_ARGS)
{
    __local float qs[ATT_ROWS * MAX_D];
    __local float sc[ATT_ROWS * MAX_L];
    __local float red[ATTENTION_WG * ATT_ROWS];
    __local float invs[ATT_ROWS];
    const int H = PARAM(13), S = PARAM(14), L = PARAM(15), Dk = PARAM(16), Dv = PARAM(17);
    const int R = PARAM(18), blocks = (S + R - 1) / R, lid = get_local_id(0);
    const int bh = get_group_id(0) / blocks, i0 = (get_group_id(0) % blocks) * R;
    const int hh = bh % H, bb = bh / H;
    const __global float* q = Q + T_OFF(0) + bb * PARAM(0) + hh * PARAM(1);
    const __global float* k = K + T_OFF(1) + bb * PARAM(4) + hh * PARAM(5);
    const __global float* v = V + T_OFF(2) + bb * PARAM(8) + hh * PARAM(9);
    const int qs_ = PARAM(2), qd = PARAM(3), kl = PARAM(6), kd = PARAM(7), vl = PARAM(10), vd = PARAM(11);
    KV_SETUP(bb, hh)
    if (i0 == 0) KV_WRITE(bb, hh, lid, ATTENTION_WG)
    for (int t = lid; t < R * Dk; t += ATTENTION_WG) {   // rows past S: zeros (never stored)
        const int r = t / Dk, d = t % Dk;
        qs[r * MAX_D + d] = i0 + r < S ? q[(i0 + r) * qs_ + d * qd] : 0.0f;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int j = lid; j < L; j += ATTENTION_WG) {
        const __global float* kj = K_ROW(j);
        const int kdj = K_D(j);
        float acc[ATT_ROWS];
#pragma unroll
        for (int r = 0; r < ATT_ROWS; ++r) acc[r] = 0.0f;
        for (int d = 0; d < Dk; ++d) {
            const float kv = kj[d * kdj];
#pragma unroll
            for (int r = 0; r < ATT_ROWS; ++r)
                if (r < R) acc[r] += qs[r * MAX_D + d] * kv;
        }
#pragma unroll
        for (int r = 0; r < ATT_ROWS; ++r)
            if (r < R) sc[r * MAX_L + j] = acc[r];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    {   // prologue and softmax: lanes n = ATTENTION_WG / R per row r
        const int n = ATTENTION_WG / R, r = lid / n, sub = lid % n;
        const int row = (bh * S + min(i0 + r, S - 1));   // a row past S reads the last one's operands
        const int base = row * L;
        PROLOGUE_ROW(base, 1, 1)
        __local float* s = sc + r * MAX_L;
        float m = -INFINITY;
        for (int j = sub; j < L; j += n) {
            const float x = PROLOGUE_AT(SCALED(s[j]), j, base + j);
            s[j] = x;
            m = fmax(m, x);
        }
        m = lanes_reduce(red, lid, sub, n, m, 1);
        m = ROW_MAX(m);    // not ROW_MAX(lanes_reduce(..)): the macro would run its barriers twice
        float sum = 0.0f;
        for (int j = sub; j < L; j += n) {
            const float e = exp(s[j] - m);
            s[j] = e;
            sum += e;
        }
        sum = lanes_reduce(red, lid, sub, n, sum, 0);   // its barriers publish sc[]
        if (sub == 0) invs[r] = INV_SUM(sum);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    const int dn = min(Dv, ATTENTION_WG);     // output elements per pass
    const int parts = ATTENTION_WG / dn;      // lanes summing one element (over keys)
    const int part = lid / dn, dl = lid % dn;
    for (int d0 = 0; d0 < Dv; d0 += dn) {
        const int d = d0 + dl;
        float acc[ATT_ROWS];
#pragma unroll
        for (int r = 0; r < ATT_ROWS; ++r) acc[r] = 0.0f;
        if (part < parts && d < Dv) {
            for (int j = part; j < L; j += parts) {
                const float vv = V_ROW(j)[d * V_D(j)];
#pragma unroll
                for (int r = 0; r < ATT_ROWS; ++r)
                    if (r < R) acc[r] += sc[r * MAX_L + j] * vv;
            }
        }
#pragma unroll
        for (int r = 0; r < ATT_ROWS; ++r) red[r * ATTENTION_WG + lid] = acc[r];
        barrier(CLK_LOCAL_MEM_FENCE);
        if (part == 0 && d < Dv) {
            for (int r = 0; r < R && i0 + r < S; ++r) {
                float t = 0.0f;
                for (int p = 0; p < parts; ++p) t += red[r * ATTENTION_WG + p * dn + dl];
                Y[T_OFF(3) + bb * PARAM(19) + hh * PARAM(20) + (i0 + r) * PARAM(21) + d * PARAM(22)] =
                    SCALE_OUT(t, invs[r]);
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
}
#endif

// GPU, one query row per work-group (R = 1: decode steps and short queries): a work-group of
// ATT_DEC_WG lanes per row r = (b * H + h) * s + i. Built for latency, the row alone on its
// multiprocessor: a lane per key takes its score (float4 loads along d where the head dims are
// contiguous and 16-byte aligned, else scalar), the softmax reduces over the lanes, then lanes
// (part, column) sum the keys part, part + parts, ... of a float4 column of v and the parts are
// reduced in local memory. Every branch on VEC is uniform over the work-group.
#ifdef ATTENTION_DEC
#define ALIGNED4(p) ((((ulong)(p)) & 15) == 0)
#define LOAD4(p, c) (((const __global float4*)(p))[c])
KERNEL(attention_dec)(ATT_ARGS)
{
    __local float4 q4[MAX_D / 4];
    __local float* qs = (__local float*)q4;
    __local float sc[MAX_L];
    __local float red[ATT_DEC_WG];
    __local float4 red4[ATT_DEC_WG];
    const int r = get_group_id(0), lid = get_local_id(0);
    ATT_SETUP(r)
    if (i_ == 0) KV_WRITE(b_, h_, lid, ATT_DEC_WG)
#ifdef KV_APPEND
    const int vec_kv = knd == 1 && vnd == 1 && (knl & 3) == 0 && (vnl & 3) == 0 &&
                       ALIGNED4(kn) && ALIGNED4(vn);
#else
    const int vec_kv = 1;
#endif
    const int VEC = vec_kv && qd == 1 && kd == 1 && vd == 1 && yd == 1 && (Dk & 3) == 0 &&
                    (Dv & 3) == 0 && (kl & 3) == 0 && (vl & 3) == 0 && ALIGNED4(k) && ALIGNED4(v);
    for (int d = lid; d < Dk; d += ATT_DEC_WG) qs[d] = q[d * qd];
    barrier(CLK_LOCAL_MEM_FENCE);
    float m = -INFINITY;
    PROLOGUE_ROW(base, 1, 1)
    for (int j = lid; j < L; j += ATT_DEC_WG) {
        const __global float* kj = K_ROW(j);
        float s = 0.0f;
        if (VEC) {
            float4 s4 = 0.0f;
#pragma unroll 8
            for (int c = 0; c < Dk / 4; ++c) s4 += q4[c] * LOAD4(kj, c);
            s = s4.x + s4.y + s4.z + s4.w;
        } else {
            const int kdj = K_D(j);
            for (int d = 0; d < Dk; ++d) s += qs[d] * kj[d * kdj];
        }
        s = PROLOGUE_AT(SCALED(s), j, base + j);
        sc[j] = s;
        m = fmax(m, s);
    }
    m = lanes_reduce(red, lid, lid, ATT_DEC_WG, m, 1);
    m = ROW_MAX(m);
    float sum = 0.0f;
    for (int j = lid; j < L; j += ATT_DEC_WG) {
        const float e = exp(sc[j] - m);
        sc[j] = e;
        sum += e;
    }
    sum = lanes_reduce(red, lid, lid, ATT_DEC_WG, sum, 0);   // its barriers publish sc[]
    const float inv = INV_SUM(sum);
    if (VEC) {
        const int cols = Dv / 4, parts = ATT_DEC_WG / cols;   // Dv <= MAX_D: cols <= 64
        const int part = lid / cols, c = lid % cols;
        float4 acc = 0.0f;
        if (part < parts) {
#pragma unroll 4
            for (int j = part; j < L; j += parts) acc += sc[j] * LOAD4(V_ROW(j), c);
        }
        red4[lid] = acc;
        barrier(CLK_LOCAL_MEM_FENCE);
        if (lid < cols) {
            float4 t = red4[lid];
            for (int p = 1; p < parts; ++p) t += red4[p * cols + lid];
            vstore4(SCALE_OUT4(t, inv), lid, y);
        }
        return;
    }
    const int dn = min(Dv, ATT_DEC_WG), parts = ATT_DEC_WG / dn, part = lid / dn, dl = lid % dn;
    for (int d0 = 0; d0 < Dv; d0 += dn) {
        const int d = d0 + dl;
        float acc = 0.0f;
        if (part < parts && d < Dv)
            for (int j = part; j < L; j += parts) acc += sc[j] * V_ROW(j)[d * V_D(j)];
        red[lid] = acc;
        barrier(CLK_LOCAL_MEM_FENCE);
        if (part == 0 && d < Dv) {
            float t = 0.0f;
            for (int p = 0; p < parts; ++p) t += red[p * dn + dl];
            y[d * yd] = SCALE_OUT(t, inv);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
}
#endif
