// Element indexing: GatherElements, GatherND, ScatterElements, ScatterND. JIT: T data type, TIDX index
// type. Negative indices count from the end; out-of-range ones are an error in ONNX: flagged
// for the host in the node's slot of the index flags (the last tensor argument, common.cl
// flag_index) and clamped here so that a bad model cannot touch memory outside its tensors.

inline int fix_index(long i, int n, __global int* flag, int column) {
    if (i < -n || i >= n) flag_index(flag, i, column);
    if (i < 0) i += n;
    return (int)clamp(i, (long)0, (long)(n - 1));
}

// Offset in tensor `dt` of element `u` of tensor `it` (same rank, MAX_RANK-aligned) with its
// coordinate on `axis` replaced by the index `idx`.
inline int axis_replaced(SHAPE_INFO_PTR si, int it, int dt, int axis, int u, long idx,
                         __global int* flag) {
    int off = 0, stride = 1;
    for (int d = MAX_RANK - 1; d >= 0; --d) {
        const int n = si[it * TBLOCK + 1 + d], m = si[dt * TBLOCK + 1 + d];
        const int c = d == axis ? fix_index(idx, m, flag, 0) : u % n;
        u /= n;
        off += c * stride;
        stride *= m;
    }
    return off;
}

// ---- GatherElements: out[p] = data[p with p[axis] = indices[p]] ------------------------------
// Tensors: 0 data, 1 indices, 2 out (the indices' shape), 3 flag. PARAM(0): axis as a
// MAX_RANK-aligned dim.
#ifdef GATHER_ELEMENTS
KERNEL(gather_elements)(OPTIONAL_SHAPE_INFO_ARG __global const T* data,
                        __global const TIDX* indices, __global T* out, __global int* flags)
{
    const int gid = get_global_id(0);
    if (gid >= T_COUNT(1)) return;
    const int off = axis_replaced(shape_info, 1, 0, PARAM(0), gid, indices[T_OFF(1) + gid],
                                  flags + T_OFF(3));
    out[T_OFF(2) + gid] = data[T_OFF(0) + off];
}
#endif

// ---- GatherND: out[r, ...] = data[batch of r, indices[r, :k], ...] ----------------------------
// Tensors: 0 data, 1 indices [batch..., rows..., k] (flattened), 2 out [index rows, slice], 3 flag.
// PARAM(0): k, PARAM(1): slice (elements per index row), PARAM(2): index rows per batch entry,
// PARAM(3): data elements per batch entry (0 without batch_dims), PARAM(4..9): element strides
// of data's k indexed dims, PARAM(10..15): those dims.
#ifdef GATHER_ND
KERNEL(gather_nd)(OPTIONAL_SHAPE_INFO_ARG __global const T* data, __global const TIDX* indices,
                  __global T* out, __global int* flags)
{
    const int gid = get_global_id(0);
    if (gid >= T_COUNT(2)) return;
    const int k = PARAM(0), slice = PARAM(1);
    const int r = gid / slice;
    int off = gid - r * slice + (r / PARAM(2)) * PARAM(3);
    for (int j = 0; j < k; ++j)
        off += fix_index(indices[T_OFF(1) + r * k + j], PARAM(10 + j), flags + T_OFF(3), j) * PARAM(4 + j);
    out[T_OFF(2) + gid] = data[T_OFF(0) + off];
}
#endif

// REDUCE_INTO(o, v): store v into the output element o (none / add / mul / max / min).
// The host runs one work-item when a reduction is set, so duplicate indices accumulate in order.

// ---- ScatterElements: out = data, then out[p with p[axis] = indices[p]] <- updates[p] --------
// Tensors: 0 data, 1 indices, 2 updates, 3 out, 4 flag. PARAM(0): axis (aligned dim).
#ifdef SCATTER_ELEMENTS
KERNEL(scatter_elements)(OPTIONAL_SHAPE_INFO_ARG __global const T* data,
                         __global const TIDX* indices, __global const T* updates, __global T* out,
                         __global int* flags)
{
    for (int u = get_global_id(0); u < T_COUNT(1); u += get_global_size(0)) {
        const int off = axis_replaced(shape_info, 1, 3, PARAM(0), u, indices[T_OFF(1) + u],
                                      flags + T_OFF(4));
        REDUCE_INTO(out[T_OFF(3) + off], updates[T_OFF(2) + u]);
    }
}
#endif

// ---- ScatterND: out = data, then out[indices[r, :k], ...] <- updates[r, ...] ------------------
// Tensors: 0 data, 1 indices [rows, k] (flattened), 2 updates [rows, slice], 3 out, 4 flag.
// PARAM(0): k, PARAM(1): slice (elements per index row), PARAM(2): rows,
// PARAM(3..8): element strides of out's first k dims, PARAM(9..14): those dims.
#ifdef SCATTER_ND
KERNEL(scatter_nd)(OPTIONAL_SHAPE_INFO_ARG __global const T* data,
                   __global const TIDX* indices, __global const T* updates, __global T* out,
                   __global int* flags)
{
    const int k = PARAM(0), slice = PARAM(1), total = PARAM(1) * PARAM(2);
    for (int u = get_global_id(0); u < total; u += get_global_size(0)) {
        const int r = u / slice;
        int off = u - r * slice;
        for (int j = 0; j < k; ++j)
            off += fix_index(indices[T_OFF(1) + r * k + j], PARAM(9 + j), flags + T_OFF(4), j) * PARAM(3 + j);
        REDUCE_INTO(out[T_OFF(3) + off], updates[T_OFF(2) + u]);
    }
}
#endif
