// TopK along one axis, X viewed as [outer, A, inner]. One work-item per input element: its
// rank in its row is the number of elements that beat it (larger, or smaller with LARGEST 0;
// on a tie the lower index wins, as ONNX asks); ranks below K are written to that slot. No
// sort and no scratch; the output is sorted whatever `sorted` says. O(A) compares per item,
// read from local memory: a work-group (WG items along A, one row) loads the row tile by
// tile, so each element is read from global memory A / WG times less than item by item.
// NDRange: dim 0 the row's elements (rounded up to WG), dim 1 the rows (outer * inner).
// Tensors: 0 X, 1 Values, 2 Indices (long). JIT: T data type, LARGEST, WG.
// PARAM(0) A, PARAM(1) inner, PARAM(2) K.
KERNEL(topk)(OPTIONAL_SHAPE_INFO_ARG __global const T* X, __global T* V, __global long* I)
{
    __local T_C tile[WG];
    const int A = PARAM(0), inner = PARAM(1), K = PARAM(2);
    const int a = get_global_id(0), lid = get_local_id(0), r = get_global_id(1);
    const int in_i = r % inner, o = r / inner;
    const __global T* row = X + T_OFF(0) + o * A * inner + in_i;
    const T_C v = a < A ? LOAD_T(row, a * inner) : 0;
    int rank = 0;
    for (int t = 0; t < A; t += WG) {
        if (t + lid < A) tile[lid] = LOAD_T(row, (t + lid) * inner);
        barrier(CLK_LOCAL_MEM_FENCE);
        const int n = min(WG, A - t);
        for (int j = 0; j < n; ++j) {
            const T_C u = tile[j];
#if LARGEST
            rank += (u > v || (u == v && t + j < a)) ? 1 : 0;
#else
            rank += (u < v || (u == v && t + j < a)) ? 1 : 0;
#endif
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (a >= A || rank >= K) return;
    const int out = (o * K + rank) * inner + in_i;
    STORE_T(V, T_OFF(1) + out, v);
    I[T_OFF(2) + out] = a;
}
