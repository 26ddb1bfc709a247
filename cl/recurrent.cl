// The recurrence of LSTM, GRU and RNN over a whole sequence (engine/ops/recurrent.py). The input
// projection X W^T of every step was computed before by the GEMM kernel into XW; here one
// work-group runs one (direction, batch row) through all its steps, so no step needs another
// launch: its lanes own hidden units j = lid, lid + WG, ... and a barrier separates the steps.
// The state lives in ST (global scratch, one region per work-group), read by every lane.
//
// Tensors: 0 XW [D, rows, G*H] (rows: X's, s * B + b, or b * S + s with LAYOUT 1), 1 R
// [D, G*H, H], 2 B [D, 2*G*H], 3 sequence_lens [B], 4 initial_h, 5 initial_c, 6 P [D, 3*H],
// 7 Y, 8 Y_h, 9 Y_c, 10 ST [D, B, 5, H] (h twice: read and written alternately; c; r * h and z
// for GRU's reset). An absent optional tensor is bound to another one and never read (HAS_*);
// an output nothing reads has no buffer and is never written (WANT_*).
// JIT: CELL (0 RNN, 1 GRU, 2 LSTM), NGATES, LAYOUT, REV0 (direction 0 runs backwards), LBR
// (GRU's linear_before_reset), INPUT_FORGET, CLIP (0: none), ACT_F/G/H(d, x) (per direction),
// T_SEQ (sequence_lens' element type).
// PARAM(0) S, PARAM(1) B, PARAM(2) H, PARAM(3) D.

#if CLIP
#define CLIPPED(x) clamp((x), -CLIP_VAL, CLIP_VAL)
#else
#define CLIPPED(x) (x)
#endif

inline float sigmoid_f(float x) { return 1.0f / (1.0f + exp(-x)); }
inline float softplus_f(float x) { return x > 20.0f ? x : log1p(exp(x)); }

// row . h over n values, 4 at a time (a row of R and the state are both contiguous)
inline float dot_row(const __global float* row, const __global float* h, int n) {
    float4 acc = (float4)(0.0f);
    int i = 0;
    for (; i + 4 <= n; i += 4) acc = mad(vload4(0, row + i), vload4(0, h + i), acc);
    float a = (acc.s0 + acc.s1) + (acc.s2 + acc.s3);
    for (; i < n; ++i) a = mad(row[i], h[i], a);
    return a;
}

KERNEL(recurrent_seq)(OPTIONAL_SHAPE_INFO_ARG __global const float* XW, __global const float* R,
                      __global const float* Bias, __global const T_SEQ* SL,
                      __global const float* H0, __global const float* C0,
                      __global const float* P, __global float* Y, __global float* YH,
                      __global float* YC, __global float* ST)
{
    const int S = PARAM(0), NB = PARAM(1), H = PARAM(2), D = PARAM(3);
    const int GH = NGATES * H;
    const int grp = get_group_id(0), lid = get_local_id(0), WG = get_local_size(0);
    // the grid is exactly D * B groups (an empty batch empties every output: the node does not
    // run); no early return either: PoCL aborts on a return before the step barriers
    const int d = grp / NB, b = grp % NB;
    const int rev = d == 1 || REV0;
    int len = S;
#if HAS_SEQ
    len = clamp((int)SL[T_OFF(3) + b], 0, S);
#endif
    const __global float* xw = XW + T_OFF(0) + d * S * NB * GH;
    const __global float* r = R + T_OFF(1) + d * GH * H;
#if HAS_B
    const __global float* wb = Bias + T_OFF(2) + d * 2 * GH;
    const __global float* rb = wb + GH;
#endif
#if HAS_P
    const __global float* p = P + T_OFF(6) + d * 3 * H;
#endif
    __global float* st = ST + T_OFF(10) + (d * NB + b) * 5 * H;
    __global float* cs = st + 2 * H;
    // Y_h, Y_c and the initial states: [D, B, H], or [B, D, H] with LAYOUT 1
    const int so = (LAYOUT ? b * D + d : d * NB + b) * H;

    for (int j = lid; j < H; j += WG) {
#if HAS_H0
        st[j] = H0[T_OFF(4) + so + j];
#else
        st[j] = 0.0f;
#endif
#if CELL == 2
#if HAS_C0
        cs[j] = C0[T_OFF(5) + so + j];
#else
        cs[j] = 0.0f;
#endif
#endif
    }
    barrier(CLK_GLOBAL_MEM_FENCE);

    for (int k = 0; k < len; ++k) {
        const int t = rev ? len - 1 - k : k;
        const __global float* hp = st + (k & 1) * H;
        __global float* hn = st + ((k + 1) & 1) * H;
        const __global float* x = xw + (LAYOUT ? b * S + t : t * NB + b) * GH;
#if CELL == 1 && !LBR
        // GRU, reset before the product: z and r * h_prev of every unit first
        __global float* rh = st + 3 * H;
        __global float* zs = st + 4 * H;
        for (int j = lid; j < H; j += WG) {
            float gz = x[j] + dot_row(r + j * H, hp, H);
            float gr = x[H + j] + dot_row(r + (H + j) * H, hp, H);
#if HAS_B
            gz += wb[j] + rb[j];
            gr += wb[H + j] + rb[H + j];
#endif
            zs[j] = ACT_F(d, CLIPPED(gz));
            rh[j] = ACT_F(d, CLIPPED(gr)) * hp[j];
        }
        barrier(CLK_GLOBAL_MEM_FENCE);
        for (int j = lid; j < H; j += WG) {
            float gh = x[2 * H + j] + dot_row(r + (2 * H + j) * H, rh, H);
#if HAS_B
            gh += wb[2 * H + j] + rb[2 * H + j];
#endif
            const float z = zs[j];
            const float h = (1.0f - z) * ACT_G(d, CLIPPED(gh)) + z * hp[j];
            hn[j] = h;
#if WANT_Y
            Y[T_OFF(7) + (LAYOUT ? (b * S + t) * D + d : (t * D + d) * NB + b) * H + j] = h;
#endif
        }
#else
        for (int j = lid; j < H; j += WG) {
            float acc[NGATES], gx[NGATES];
            for (int g = 0; g < NGATES; ++g) acc[g] = dot_row(r + (g * H + j) * H, hp, H);
            for (int g = 0; g < NGATES; ++g) {
                gx[g] = x[g * H + j];
#if HAS_B
                gx[g] += wb[g * H + j];
                acc[g] += rb[g * H + j];
#endif
            }
#if CELL == 0
            const float h = ACT_F(d, CLIPPED(gx[0] + acc[0]));
#elif CELL == 1
            // GRU, linear_before_reset: r scales h_prev R_h^T + Rb_h
            const float z = ACT_F(d, CLIPPED(gx[0] + acc[0]));
            const float rg = ACT_F(d, CLIPPED(gx[1] + acc[1]));
            const float h = (1.0f - z) * ACT_G(d, CLIPPED(gx[2] + rg * acc[2])) + z * hp[j];
#else
            // LSTM, gates i, o, f, c; peepholes i, o, f
            const float cp = cs[j];
            float pi = 0.0f, po = 0.0f, pf = 0.0f;
#if HAS_P
            pi = p[j];
            po = p[H + j];
            pf = p[2 * H + j];
#endif
            const float ig = ACT_F(d, CLIPPED(gx[0] + acc[0] + pi * cp));
#if INPUT_FORGET
            const float fg = 1.0f - ig;
#else
            const float fg = ACT_F(d, CLIPPED(gx[2] + acc[2] + pf * cp));
#endif
            const float cg = ACT_G(d, CLIPPED(gx[3] + acc[3]));
            const float c = fg * cp + ig * cg;
            const float og = ACT_F(d, CLIPPED(gx[1] + acc[1] + po * c));
            const float h = og * ACT_H(d, c);
            cs[j] = c;   // this lane's own unit: no other lane reads it
#endif
            hn[j] = h;
#if WANT_Y
            Y[T_OFF(7) + (LAYOUT ? (b * S + t) * D + d : (t * D + d) * NB + b) * H + j] = h;
#endif
        }
#endif
        barrier(CLK_GLOBAL_MEM_FENCE);
    }

    // steps past this row's length: Y is zero there; with no step at all, so are Y_h and Y_c
    // (onnxruntime's convention)
    for (int j = lid; j < H; j += WG) {
#if WANT_Y
        for (int t = len; t < S; ++t)
            Y[T_OFF(7) + (LAYOUT ? (b * S + t) * D + d : (t * D + d) * NB + b) * H + j] = 0.0f;
#endif
#if WANT_YH
        YH[T_OFF(8) + so + j] = len ? st[(len & 1) * H + j] : 0.0f;
#endif
#if WANT_YC
        YC[T_OFF(9) + so + j] = len ? cs[j] : 0.0f;
#endif
    }
}
