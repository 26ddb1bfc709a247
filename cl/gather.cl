// Gather. JIT: T element type, TIDX index type.
// Gather along an axis: data viewed as [outer, axis_dim, inner], indices flattened (n of them).
// PARAM(0): outer, PARAM(1): axis_dim, PARAM(2): inner, PARAM(3): number of indices.
// Tensor 3: the node's slot of the index flags (common.cl flag_index); fused ops' inputs after.
KERNEL(gather)(OPTIONAL_SHAPE_INFO_ARG __global const T* data, __global const TIDX* indices,
               __global T* out, __global int* flags FUSED_ARGS)
{
    const int gid = get_global_id(0);
    const int inner = PARAM(2), n = PARAM(3), axis_dim = PARAM(1);
    if (gid >= PARAM(0) * n * inner) return;
    const int k = gid % inner;
    const int j = (gid / inner) % n;
    const int o = gid / (inner * n);
    long idx = indices[T_OFF(1) + j];
    // Out-of-range indices are an error in ONNX: flagged for the host, clamped so that a bad
    // model cannot read out of bounds.
    if (idx < -axis_dim || idx >= axis_dim) flag_index(flags + T_OFF(3), idx, 0);
    if (idx < 0) idx += axis_dim;
    idx = clamp(idx, (long)0, (long)(axis_dim - 1));
    // fused ops (engine/fusion.py: an embedding's position add) only on float32 outputs
    out[T_OFF(2) + gid] = FUSED_OPS(data[T_OFF(0) + (o * axis_dim + (int)idx) * inner + k], gid);
}
