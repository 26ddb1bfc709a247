// Gather. JIT: T element type, TIDX index type.
// Gather along an axis: data viewed as [outer, axis_dim, inner], indices flattened (n of them).
// PARAM(0): outer, PARAM(1): axis_dim, PARAM(2): inner, PARAM(3): number of indices.
KERNEL(gather)(OPTIONAL_SHAPE_INFO_ARG __global const T* data, __global const TIDX* indices,
               __global T* out)
{
    const int gid = get_global_id(0);
    const int inner = PARAM(2), n = PARAM(3), axis_dim = PARAM(1);
    if (gid >= PARAM(0) * n * inner) return;
    const int k = gid % inner;
    const int j = (gid / inner) % n;
    const int o = gid / (inner * n);
    long idx = indices[T_OFF(1) + j];
    if (idx < 0) idx += axis_dim;
    // Out-of-range indices are an error in ONNX; clamp so a bad model cannot read out of bounds.
    idx = clamp(idx, (long)0, (long)(axis_dim - 1));
    out[T_OFF(2) + gid] = data[T_OFF(0) + (o * axis_dim + (int)idx) * inner + k];
}
