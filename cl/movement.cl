// Strided copy: Transpose, Slice, Expand and Concat.
// JIT: T element type.

// Iterates over the dims of tensor 1 (the destination's view, or the region written).
// PARAM(0..5): source strides per dim (0 broadcasts), PARAM(6): extra source offset,
// PARAM(7..12): destination strides, PARAM(13): extra destination offset.
KERNEL(copy_strided)(OPTIONAL_SHAPE_INFO_ARG __global const T* src, __global T* dst)
{
    const int gid = get_global_id(0);
    if (gid >= T_COUNT(1)) return;
    int rem = gid, s = T_OFF(0) + PARAM(6), o = T_OFF(1) + PARAM(13);
    for (int d = MAX_RANK - 1; d >= 0; --d) {
        const int n = T_DIM(1, d);
        const int i = rem % n;
        rem /= n;
        s += i * PARAM(d);
        o += i * PARAM(7 + d);
    }
    dst[o] = src[s];
}
