// Unique over the flattened input (engine/ops/unique.py), as two primitives like NonZero:
// count_unique writes the number of distinct values (one work-group of WG items, each item a
// strided share of the elements); gather_unique runs mark_first (mark[i]: x[i] occurs first
// at i) and then scatter_unique, one item per element: its output slot is the number of
// distinct values below it (SORTED) or of first occurrences before its own (order of first
// occurrence). O(n) per item, no sort: inputs of Unique in real models are small (token ids,
// labels, boxes' classes).
// JIT: T data type (LOAD_T), SORTED, WG.

inline int first_at(__global const T* x, int i, T_C v)
{
    for (int j = 0; j < i; ++j)
        if (LOAD_T(x, j) == v) return 0;
    return 1;
}

// args: X, count (one long)
KERNEL(count_unique)(OPTIONAL_SHAPE_INFO_ARG __global const T* X, __global long* count)
{
    __local int part[WG];
    const int lid = get_local_id(0), n = T_COUNT(0);
    const __global T* x = X + T_OFF(0);
    int c = 0;
    for (int i = lid; i < n; i += WG) c += first_at(x, i, LOAD_T(x, i));
    part[lid] = c;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = WG / 2; s > 0; s >>= 1) {
        if (lid < s) part[lid] += part[lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0) count[T_OFF(1)] = (long)part[0];
}

// args: X, mark (internal int [n])
KERNEL(mark_first)(OPTIONAL_SHAPE_INFO_ARG __global const T* X, __global int* mark)
{
    const int i = get_global_id(0);
    if (i >= T_COUNT(0)) return;
    const __global T* x = X + T_OFF(0);
    mark[T_OFF(1) + i] = first_at(x, i, LOAD_T(x, i));
}

// args: X, mark, Y [u], indices [u], inverse [n], counts [u]
KERNEL(scatter_unique)(OPTIONAL_SHAPE_INFO_ARG __global const T* X, __global const int* mark,
                       __global T* Y, __global long* idx, __global long* inv, __global long* cnt)
{
    const int i = get_global_id(0), n = T_COUNT(0);
    if (i >= n) return;
    const __global T* x = X + T_OFF(0);
    const __global int* m = mark + T_OFF(1);
    const T_C v = LOAD_T(x, i);
    int pos = 0, first = -1, c = 0;
    for (int j = 0; j < n; ++j) {
        const T_C u = LOAD_T(x, j);
        const int eq = u == v;
        if (eq && first < 0) first = j;
        c += eq;
#if SORTED
        pos += (m[j] && u < v) ? 1 : 0;
#else
        pos += (m[j] && first < 0) ? 1 : 0;
#endif
    }
    inv[T_OFF(4) + i] = pos;
    if (first == i) {
        STORE_T(Y, T_OFF(2) + pos, v);
        idx[T_OFF(3) + pos] = i;
        cnt[T_OFF(5) + pos] = c;
    }
}
