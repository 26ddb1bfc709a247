// Fused attention (engine/ops/attention.py): y = softmax(prologue(q . k)) @ v per query row; the
// scores and probabilities stay in private (CPU) or local (GPU) memory.
// Tensors: 0 Q, 1 K, 2 V, 3 Y [b, h, s, dv] (dense), 4 the scores' dims [b, h, s, l] (a buffer
// never read: the prologue's broadcast reference), then the prologue's operands (scale, mask).
// PARAM(0..3) Q strides (b, h, s, d), PARAM(4..7) K strides (b, h, l, d), PARAM(8..11) V strides
// (b, h, l, d) (0 along a broadcast batch dim), PARAM(12) b, PARAM(13) h, PARAM(14) s,
// PARAM(15) l (<= MAX_L), PARAM(16) dk, PARAM(17) dv (<= MAX_D). Row r = (b * h + h) * s + i.

#define ATT_ARGS OPTIONAL_SHAPE_INFO_ARG __global const float* Q, __global const float* K, \
    __global const float* V, __global float* Y, __global const float* scores_dims PROLOGUE_ARGS

// Pointers to row r's q row, k and v (head base) and y row.
#define ATT_SETUP(r) \
    const int H = PARAM(13), S = PARAM(14), L = PARAM(15), Dk = PARAM(16), Dv = PARAM(17); \
    const int i_ = (r) % S, bh_ = (r) / S, h_ = bh_ % H, b_ = bh_ / H; \
    const __global float* q = Q + T_OFF(0) + b_ * PARAM(0) + h_ * PARAM(1) + i_ * PARAM(2); \
    const __global float* k = K + T_OFF(1) + b_ * PARAM(4) + h_ * PARAM(5); \
    const __global float* v = V + T_OFF(2) + b_ * PARAM(8) + h_ * PARAM(9); \
    __global float* y = Y + T_OFF(3) + (r) * Dv; \
    const int qd = PARAM(3), kl = PARAM(6), kd = PARAM(7), vl = PARAM(10), vd = PARAM(11); \
    const int base = (r) * L;

// CPU: a work-item per query row, no barriers.
#ifdef ATTENTION_ROW
KERNEL(attention_row)(ATT_ARGS)
{
    const int r = get_global_id(0);
    if (r >= PARAM(12) * PARAM(13) * PARAM(14)) return;
    ATT_SETUP(r)
    PROLOGUE_ROW(base, 1, 1)
    float sc[MAX_L];
    float m = -INFINITY;
    if (qd == 1 && kd == 1 && vd == 1 && (Dk & 7) == 0 && (Dv & 7) == 0) {
        // contiguous head dims (k's Transpose absorbed): float8 dot products and a float8
        // accumulator row (explicit SIMD; PoCL does not vectorise the float reductions)
        float8 qv[MAX_D / 8], acc[MAX_D / 8];
        for (int c = 0; c < Dk / 8; ++c) qv[c] = vload8(c, q);
        for (int j = 0; j < L; ++j) {
            const __global float* kj = k + j * kl;
            float8 s8 = 0.0f;
            for (int c = 0; c < Dk / 8; ++c) s8 += qv[c] * vload8(c, kj);
            float s = s8.s0 + s8.s1 + s8.s2 + s8.s3 + s8.s4 + s8.s5 + s8.s6 + s8.s7;
            s = PROLOGUE_AT(s, j, base + j);
            sc[j] = s;
            m = fmax(m, s);
        }
        float sum = 0.0f;
        for (int c = 0; c < Dv / 8; ++c) acc[c] = 0.0f;
        for (int j = 0; j < L; ++j) {
            const float e = exp(sc[j] - m);
            sum += e;
            const __global float* vj = v + j * vl;
            for (int c = 0; c < Dv / 8; ++c) acc[c] += e * vload8(c, vj);
        }
        const float inv = 1.0f / sum;
        for (int c = 0; c < Dv / 8; ++c) vstore8(acc[c] * inv, c, y);
        return;
    }
    for (int j = 0; j < L; ++j) {
        const __global float* kj = k + j * kl;
        float s = 0.0f;
        for (int d = 0; d < Dk; ++d) s += q[d * qd] * kj[d * kd];
        s = PROLOGUE_AT(s, j, base + j);
        sc[j] = s;
        m = fmax(m, s);
    }
    float sum = 0.0f;
    for (int j = 0; j < L; ++j) {
        const float e = exp(sc[j] - m);
        sc[j] = e;
        sum += e;
    }
    const float inv = 1.0f / sum;
    for (int d = 0; d < Dv; ++d) {
        float acc = 0.0f;
        for (int j = 0; j < L; ++j) acc += sc[j] * v[j * vl + d * vd];
        y[d] = acc * inv;
    }
}
#endif

// GPU: a work-group of ATTENTION_WG lanes per query row: lanes split the keys for the scores
// (q row in local memory), local reductions of the max and the sum, then lanes split (d, keys)
// for the output (consecutive lanes read consecutive v elements).
#ifdef ATTENTION_WG
inline float wg_reduce(__local float* red, int lid, float v, int is_max) {
    red[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int h = ATTENTION_WG / 2; h > 0; h >>= 1) {
        if (lid < h) red[lid] = is_max ? fmax(red[lid], red[lid + h]) : red[lid] + red[lid + h];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float r = red[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

KERNEL(attention_wg)(ATT_ARGS)
{
    __local float qs[MAX_D];
    __local float sc[MAX_L];
    __local float red[ATTENTION_WG];
    const int r = get_group_id(0), lid = get_local_id(0);
    ATT_SETUP(r)
    PROLOGUE_ROW(base, 1, 1)
    for (int d = lid; d < Dk; d += ATTENTION_WG) qs[d] = q[d * qd];
    barrier(CLK_LOCAL_MEM_FENCE);
    float m = -INFINITY;
    for (int j = lid; j < L; j += ATTENTION_WG) {
        const __global float* kj = k + j * kl;
        float s = 0.0f;
        for (int d = 0; d < Dk; ++d) s += qs[d] * kj[d * kd];
        s = PROLOGUE_AT(s, j, base + j);
        sc[j] = s;
        m = fmax(m, s);
    }
    m = wg_reduce(red, lid, m, 1);
    float sum = 0.0f;
    for (int j = lid; j < L; j += ATTENTION_WG) {
        const float e = exp(sc[j] - m);
        sc[j] = e;
        sum += e;
    }
    const float inv = 1.0f / wg_reduce(red, lid, sum, 0);   // its barriers publish sc[]
    const int dn = min(Dv, ATTENTION_WG);     // output elements per pass
    const int parts = ATTENTION_WG / dn;      // lanes summing one element (over keys)
    const int part = lid / dn, dl = lid % dn;
    for (int d0 = 0; d0 < Dv; d0 += dn) {
        const int d = d0 + dl;
        float acc = 0.0f;
        if (part < parts && d < Dv)
            for (int j = part; j < L; j += parts) acc += sc[j] * v[j * vl + d * vd];
        red[lid] = acc;
        barrier(CLK_LOCAL_MEM_FENCE);
        if (part == 0 && d < Dv) {
            float t = 0.0f;
            for (int p = 0; p < parts; ++p) t += red[p * dn + dl];
            y[d] = t * inv;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
}
#endif
