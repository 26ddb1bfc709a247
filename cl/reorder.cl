// Weights reorder for static GEMM impls (update_weights): B [K, N] (or [N, K] with TRANS_B)
// -> [ceil(N/TN)][K][TN], columns past N zero-filled.
// Tensors: 0 W (original), 1 Out. PARAM(0) K, PARAM(1) N, PARAM(2) elements of Out.
KERNEL(reorder_weights)(OPTIONAL_SHAPE_INFO_ARG __global const float* W, __global float* Out)
{
    const int gid = get_global_id(0);
    if (gid >= PARAM(2)) return;
    const int K = PARAM(0), N = PARAM(1);
    const int l = gid % TN, rest = gid / TN;
    const int k = rest % K, n = (rest / K) * TN + l;
    float v = 0.0f;
    if (n < N) {
#if TRANS_B
        v = W[T_OFF(0) + n * K + k];
#else
        v = W[T_OFF(0) + k * N + n];
#endif
    }
    Out[T_OFF(1) + gid] = v;
}
