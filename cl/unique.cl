// Unique (engine/ops/unique.py), as two primitives like NonZero. The input is viewed as
// [outer, A, inner]; the items compared are its A slices along the axis (L = outer * inner
// values each, in row-major order; without an axis: A = n elements, L = 1). count_unique writes
// the number of distinct slices (one work-group of WG items, each a strided share of them);
// gather_unique runs mark_first (mark[a]: slice a occurs first at a) and then scatter_unique,
// one item per slice: its output slot is the number of distinct slices below it (SORTED,
// lexicographic) or of first occurrences before its own (order of first occurrence). O(A * L)
// per item, no sort: inputs of Unique in real models are small (token ids, labels, classes).
// JIT: T data type (LOAD_T/STORE_T), SORTED, WG. PARAM(0) A, PARAM(1) inner.

// -1, 0, 1: slice a against slice b
inline int cmp_slices(__global const T* x, int a, int b, int A, int inner, int L)
{
    for (int k = 0; k < L; ++k) {
        const int o = k / inner, i = k - o * inner;
        const T_C u = LOAD_T(x, (o * A + a) * inner + i), v = LOAD_T(x, (o * A + b) * inner + i);
        if (u != v) return u < v ? -1 : 1;
    }
    return 0;
}

inline int first_at(__global const T* x, int a, int A, int inner, int L)
{
    for (int j = 0; j < a; ++j)
        if (cmp_slices(x, j, a, A, inner, L) == 0) return 0;
    return 1;
}

// args: X, count (one long)
KERNEL(count_unique)(OPTIONAL_SHAPE_INFO_ARG __global const T* X, __global long* count)
{
    __local int part[WG];
    const int lid = get_local_id(0), A = PARAM(0), inner = PARAM(1);
    const int L = A ? T_COUNT(0) / A : 0;
    const __global T* x = X + T_OFF(0);
    int c = 0;
    for (int a = lid; a < A; a += WG) c += first_at(x, a, A, inner, L);
    part[lid] = c;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = WG / 2; s > 0; s >>= 1) {
        if (lid < s) part[lid] += part[lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0) count[T_OFF(1)] = (long)part[0];
}

// args: X, mark (internal int [A])
KERNEL(mark_first)(OPTIONAL_SHAPE_INFO_ARG __global const T* X, __global int* mark)
{
    const int a = get_global_id(0), A = PARAM(0);
    if (a >= A) return;
    mark[T_OFF(1) + a] = first_at(X + T_OFF(0), a, A, PARAM(1), T_COUNT(0) / A);
}

// args: X, mark, Y [outer, u, inner], indices [u], inverse [A], counts [u]
KERNEL(scatter_unique)(OPTIONAL_SHAPE_INFO_ARG __global const T* X, __global const int* mark,
                       __global T* Y, __global long* idx, __global long* inv, __global long* cnt)
{
    const int a = get_global_id(0), A = PARAM(0), inner = PARAM(1);
    if (a >= A) return;
    const int L = T_COUNT(0) / A, U = L ? T_COUNT(2) / L : 0;
    const __global T* x = X + T_OFF(0);
    const __global int* m = mark + T_OFF(1);
    int pos = 0, first = -1, c = 0;
    for (int j = 0; j < A; ++j) {
        const int r = cmp_slices(x, j, a, A, inner, L);
        if (r == 0 && first < 0) first = j;
        c += r == 0;
#if SORTED
        pos += (m[j] && r < 0) ? 1 : 0;
#else
        pos += (m[j] && first < 0) ? 1 : 0;
#endif
    }
    inv[T_OFF(4) + a] = pos;
    if (first != a) return;
    idx[T_OFF(3) + pos] = a;
    cnt[T_OFF(5) + pos] = c;
    for (int k = 0; k < L; ++k) {
        const int o = k / inner, i = k - o * inner;
        STORE_T(Y, T_OFF(2) + (o * U + pos) * inner + i, LOAD_T(x, (o * A + a) * inner + i));
    }
}
