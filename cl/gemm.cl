// Batched GEMM with numpy broadcasting over batch dims: Y = ALPHA * op(A) x op(B) + BETA * C.
// Tensors: 0 A [.., M, K] (or [.., K, M] with TRANS_A), 1 B [.., K, N] (or [.., N, K] with
// TRANS_B), [2 C bias, broadcast to Y], then Y [.., M, N].
// JIT: TRANS_A, TRANS_B, HAS_BIAS, ALPHA, BETA, TS (tile size of gemm_tiled; work-group TS x TS).
// PARAM(0) M, PARAM(1) N, PARAM(2) K, PARAM(3) batch count.
#if HAS_BIAS
#define Y_T 3
#define GEMM_BIAS_ARG __global const float* C,
#else
#define Y_T 2
#define GEMM_BIAS_ARG
#endif
// The tensor arguments every GEMM kernel starts with, in the order the engine binds them.
#define GEMM_TENSORS __global const float* A, __global const float* B, GEMM_BIAS_ARG __global float* Y

// Batch offsets: decompose the flat batch index over Y's batch dims (all but the last two),
// broadcasting A and B where their batch dim is 1.
// Matrix stride of operand t. Dynamic builds take it from the operand's dims, so a padded
// operand (the KV cache: more rows than used) is walked right; static tables hold fake-aligned
// rows and never see padded operands, so they use the real sizes.
#if IS_DYNAMIC
#define GEMM_MAT_STRIDE(t, dense) (T_DIM(t, MAX_RANK - 2) * T_DIM(t, MAX_RANK - 1))
#else
#define GEMM_MAT_STRIDE(t, dense) (dense)
#endif

#define GEMM_BATCH_OFFSETS(bat, M, N, K)                        \
    int a_off = T_OFF(0), b_off = T_OFF(1), y_off = T_OFF(Y_T); \
    {                                                           \
        int rem = bat, sy = M * N;                              \
        int sa = GEMM_MAT_STRIDE(0, M * K);                     \
        int sb = GEMM_MAT_STRIDE(1, K * N);                     \
        for (int d = MAX_RANK - 3; d >= 0; --d) {               \
            const int n = T_DIM(Y_T, d);                        \
            const int i = rem % n;                              \
            rem /= n;                                           \
            if (T_DIM(0, d) != 1) a_off += i * sa;              \
            if (T_DIM(1, d) != 1) b_off += i * sb;              \
            y_off += i * sy;                                    \
            sa *= T_DIM(0, d);                                  \
            sb *= T_DIM(1, d);                                  \
            sy *= n;                                            \
        }                                                       \
    }

// ALPHA * acc (+ BETA * C broadcast to [.., M, N]: Y's dims walked with C's right-aligned dims)
inline float gemm_epilogue(SHAPE_INFO_PTR si, __global const float* C, int c_off, float acc,
                           int idx) {
    float y = ALPHA * acc;
#if HAS_BIAS
    int rem = idx, off = 0, s = 1;
    for (int d = MAX_RANK - 1; d >= 0; --d) {
        const int n = si[Y_T * TBLOCK + 1 + d], m = si[2 * TBLOCK + 1 + d];
        const int i = rem % n;
        rem /= n;
        if (m != 1) off += i * s;
        s *= m;
    }
    y += BETA * C[c_off + off];
#endif
    return y;
}
#if HAS_BIAS
#define C_ARG C
#define C_OFF T_OFF(2)
#else
#define C_ARG ((__global const float*)0)
#define C_OFF 0
#endif

KERNEL(gemm_tiled)(OPTIONAL_SHAPE_INFO_ARG GEMM_TENSORS FUSED_ARGS)
{
    const int M = RT_PARAM(0), N = PARAM(1), K = PARAM(2);
    const int col = get_global_id(0), row = get_global_id(1), bat = get_global_id(2);
    const int lc = get_local_id(0), lr = get_local_id(1);
    GEMM_BATCH_OFFSETS(bat, M, N, K)

    __local float As[TS][TS];
    __local float Bs[TS][TS + 1];
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += TS) {
        const int ka = k0 + lc, kb = k0 + lr;
#if TRANS_A
        As[lr][lc] = (row < M && ka < K) ? A[a_off + ka * M + row] : 0.0f;
#else
        As[lr][lc] = (row < M && ka < K) ? A[a_off + row * K + ka] : 0.0f;
#endif
#if TRANS_B
        Bs[lr][lc] = (kb < K && col < N) ? B[b_off + col * K + kb] : 0.0f;
#else
        Bs[lr][lc] = (kb < K && col < N) ? B[b_off + kb * N + col] : 0.0f;
#endif
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int k = 0; k < TS; ++k) acc += As[lr][k] * Bs[k][lc];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (row >= M || col >= N || bat >= PARAM(3)) return;
    const int o = y_off - T_OFF(Y_T) + row * N + col;
    Y[y_off + row * N + col] = FUSED_OPS(gemm_epilogue(shape_info, C_ARG, C_OFF, acc, o), o);
}

// Split-K, for few rows and a long K (a decode step's GEMV, where a TS x TS tile would idle all
// but one row): each work-item sums K / S products of one output element into the internal
// buffer T [S, batch, M, N]; gemm_splitk_reduce adds the S partials and applies the epilogue
// and the fused ops. Both take the tiled kernel's tensors plus T. PARAM(4): S.
#define T_T (Y_T + 1)
KERNEL(gemm_splitk_partial)(OPTIONAL_SHAPE_INFO_ARG GEMM_TENSORS, __global float* T)
{
    const int M = PARAM(0), N = PARAM(1), K = PARAM(2), NB = PARAM(3), S = PARAM(4);
    const int col = get_global_id(0), row = get_global_id(1), bat = get_global_id(2) % NB;
    const int split = get_global_id(2) / NB;
    if (col >= N || row >= M) return;
    GEMM_BATCH_OFFSETS(bat, M, N, K)
    const int chunk = (K + S - 1) / S, k1 = min(K, (split + 1) * chunk);
    float acc = 0.0f;
    for (int k = split * chunk; k < k1; ++k) {
#if TRANS_A
        const float a = A[a_off + k * M + row];
#else
        const float a = A[a_off + row * K + k];
#endif
#if TRANS_B
        acc = mad(a, B[b_off + col * K + k], acc);
#else
        acc = mad(a, B[b_off + k * N + col], acc);
#endif
    }
    T[T_OFF(T_T) + ((split * NB + bat) * M + row) * N + col] = acc;
}

KERNEL(gemm_splitk_reduce)(OPTIONAL_SHAPE_INFO_ARG GEMM_TENSORS, __global const float* T FUSED_ARGS)
{
    const int total = PARAM(3) * PARAM(0) * PARAM(1), S = PARAM(4);
    const int o = get_global_id(0);
    if (o >= total) return;
    float acc = 0.0f;
    for (int s = 0; s < S; ++s) acc += T[T_OFF(T_T) + s * total + o];
    Y[T_OFF(Y_T) + o] = FUSED_OPS(gemm_epilogue(shape_info, C_ARG, C_OFF, acc, o), o);
}

// Register-blocked GEMM (static builds: M, N, K and the tile are compile-time constants).
// A work-item computes TM rows x TN columns (TN: vector width 4 or 8); no local memory.
// B_BLOCKED: B was reordered (update_weights) to [ceil(N/TN)][K][TN], zero-padded, so each k
// is one contiguous vector load; otherwise N % TN == 0. Fake alignment: the build's PARAM(0)
// is M rounded up; the real M comes at run time (RT_PARAM(0)); rows >= M read a clamped row and
// are never stored.
#ifdef TN
#define RB_CAT_(a, b) a##b
#define RB_CAT(a, b) RB_CAT_(a, b)
#define BV RB_CAT(float, TN)
#define BLOAD(p) RB_CAT(vload, TN)(0, p)

KERNEL(gemm_rb)(OPTIONAL_SHAPE_INFO_ARG GEMM_TENSORS FUSED_ARGS)
{
    const int M = RT_PARAM(0), N = PARAM(1), K = PARAM(2);
    const int n0 = get_global_id(0) * TN, m0 = get_global_id(1) * TM, bat = get_global_id(2);
    if (n0 >= N || m0 >= M) return;
    GEMM_BATCH_OFFSETS(bat, M, N, K)

    const __global float* ap[TM];
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int r = min(m0 + i, M - 1);
#if TRANS_A
        ap[i] = A + a_off + r;
#else
        ap[i] = A + a_off + r * K;
#endif
    }
    BV acc[TM];
#pragma unroll
    for (int i = 0; i < TM; ++i) acc[i] = (BV)(0.0f);
#if B_BLOCKED
    const __global float* bp = B + b_off + (n0 / TN) * K * TN;
#endif
    for (int k = 0; k < K; ++k) {
#if B_BLOCKED
        const BV bv = BLOAD(bp + k * TN);
#elif TRANS_B
        BV bv;
#pragma unroll
        for (int l = 0; l < TN; ++l) ((float*)&bv)[l] = B[b_off + (n0 + l) * K + k];
#else
        const BV bv = BLOAD(B + b_off + k * N + n0);
#endif
#pragma unroll
        for (int i = 0; i < TM; ++i) {
#if TRANS_A
            const float a = ap[i][k * M];
#else
            const float a = ap[i][k];
#endif
            acc[i] = mad((BV)(a), bv, acc[i]);
        }
    }
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int row = m0 + i;
        if (row >= M) break;
        for (int l = 0; l < TN && n0 + l < N; ++l) {
            const int o = y_off - T_OFF(Y_T) + row * N + n0 + l;
            const float v = gemm_epilogue(shape_info, C_ARG, C_OFF, ((float*)&acc[i])[l], o);
            Y[y_off + row * N + n0 + l] = FUSED_OPS(v, o);
        }
    }
}
#endif
