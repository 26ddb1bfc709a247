// Compress (engine/ops/compress.py): the slices of X along an axis (or the elements of the
// flattened X) whose condition is true, in order. X viewed as [outer, A, inner], Y as
// [outer, K, inner]. Each work-item finds its slice by counting the true conditions: O(A) per
// element, no scan pass (conditions are short: the host reads them for Y's shape anyway).
// JIT: T the element bits type. Tensors: 0 X, 1 condition (bool), 2 Y.
// PARAM(0) A, PARAM(1) inner, PARAM(2) K, PARAM(3) conditions read (min(len, A)).
KERNEL(compress)(OPTIONAL_SHAPE_INFO_ARG __global const T* X, __global const uchar* C, __global T* Y)
{
    const int gid = get_global_id(0);
    if (gid >= T_COUNT(2)) return;
    const int A = PARAM(0), inner = PARAM(1), K = PARAM(2), n = PARAM(3);
    const int o = gid / (K * inner), rest = gid - o * K * inner;
    const int k = rest / inner, i = rest - k * inner;
    int a = 0;
    for (int seen = -1; a < n; ++a) {
        if (C[T_OFF(1) + a] && ++seen == k) break;
    }
    Y[T_OFF(2) + gid] = X[T_OFF(0) + (o * A + a) * inner + i];
}
