// TopK along one axis, X viewed as [outer, A, inner]. One work-item per input element: its
// rank in its row is the number of elements that beat it (larger, or smaller with LARGEST 0;
// on a tie the lower index wins, as ONNX asks); ranks below K are written to that slot. O(A)
// per item: rows are short (beams, classes, a few thousand logits) and no sort or scratch is
// needed; the output is sorted whatever `sorted` says.
// Tensors: 0 X, 1 Values, 2 Indices (long). JIT: T data type, LARGEST.
// PARAM(0) A, PARAM(1) inner, PARAM(2) K.
KERNEL(topk)(OPTIONAL_SHAPE_INFO_ARG __global const T* X, __global T* V, __global long* I)
{
    const int gid = get_global_id(0);
    if (gid >= T_COUNT(0)) return;
    const int A = PARAM(0), inner = PARAM(1), K = PARAM(2);
    const int in_i = gid % inner, a = (gid / inner) % A, o = gid / (inner * A);
    const __global T* row = X + T_OFF(0) + o * A * inner + in_i;
    const T_C v = LOAD_T(row, a * inner);
    int rank = 0;
    for (int j = 0; j < A; ++j) {
        const T_C u = LOAD_T(row, j * inner);
#if LARGEST
        rank += (u > v || (u == v && j < a)) ? 1 : 0;
#else
        rank += (u < v || (u == v && j < a)) ? 1 : 0;
#endif
    }
    if (rank >= K) return;
    const int out = (o * K + rank) * inner + in_i;
    STORE_T(V, T_OFF(1) + out, v);
    I[T_OFF(2) + out] = a;
}
