// Batched GEMM with numpy broadcasting over batch dims: Y = ALPHA * op(A) x op(B) + BETA * C.
// Tensors: 0 A [.., M, K] (or [.., K, M] with TRANS_A), 1 B [.., K, N] (or [.., N, K] with
// TRANS_B), [2 C bias, broadcast to Y], then Y [.., M, N].
// JIT: TRANS_A, TRANS_B, HAS_BIAS, ALPHA, BETA, TS (tile size; work-group TS x TS).
// PARAM(0) M, PARAM(1) N, PARAM(2) K.
#if HAS_BIAS
#define Y_T 3
#else
#define Y_T 2
#endif

KERNEL(gemm_tiled)(OPTIONAL_SHAPE_INFO_ARG __global const float* A, __global const float* B,
#if HAS_BIAS
                   __global const float* C,
#endif
                   __global float* Y FUSED_ARGS)
{
    const int M = PARAM(0), N = PARAM(1), K = PARAM(2);
    const int col = get_global_id(0), row = get_global_id(1), bat = get_global_id(2);
    const int lc = get_local_id(0), lr = get_local_id(1);

    // Batch offsets: decompose the flat batch index over Y's batch dims (all but the last two),
    // broadcasting A and B where their batch dim is 1.
    int a_off = T_OFF(0), b_off = T_OFF(1), y_off = T_OFF(Y_T);
    {
        // matrix strides from the operands' dims: a padded operand (KV cache) has more rows
        int rem = bat, sa = T_DIM(0, MAX_RANK - 2) * T_DIM(0, MAX_RANK - 1);
        int sb = T_DIM(1, MAX_RANK - 2) * T_DIM(1, MAX_RANK - 1), sy = M * N;
        for (int d = MAX_RANK - 3; d >= 0; --d) {
            const int n = T_DIM(Y_T, d);
            const int i = rem % n;
            rem /= n;
            if (T_DIM(0, d) != 1) a_off += i * sa;
            if (T_DIM(1, d) != 1) b_off += i * sb;
            y_off += i * sy;
            sa *= T_DIM(0, d);
            sb *= T_DIM(1, d);
            sy *= n;
        }
    }

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
    float y = ALPHA * acc;
#if HAS_BIAS
    {
        // Bias broadcast to [.., M, N]: walk Y's dims with C's right-aligned dims.
        int rem = (bat * M + row) * N + col, off = 0, s = 1;
        for (int d = MAX_RANK - 1; d >= 0; --d) {
            const int n = T_DIM(Y_T, d);
            const int i = rem % n;
            rem /= n;
            if (T_DIM(2, d) != 1) off += i * s;
            s *= T_DIM(2, d);
        }
        y += BETA * C[T_OFF(2) + off];
    }
#endif
    Y[y_off + row * N + col] = FUSED_OPS(y, y_off - T_OFF(Y_T) + row * N + col);
}
