// Strided copy: Transpose, Slice, Expand and Concat.
// JIT: T element type; or, for a converting copy (Cast of a padded KV cache), TS / TD source
// and destination type slots (engine.f16.type_jit) and CONVERT(v) the value stored.

// Iterates over the dims of tensor 1 (the destination's view, or the region written).
// PARAM(0..5): source strides per dim (0 broadcasts), PARAM(6): extra source offset,
// PARAM(7..12): destination strides, PARAM(13): extra destination offset.

// int s, o: the source and destination offsets of element (or row) `gid` of tensor 1's dims
// `top` down to 0 (copy_strided: every dim; copy_rows: all but the innermost).
#define COPY_OFFSETS(gid, top) \
    int rem = (gid), s = T_OFF(0) + PARAM(6), o = T_OFF(1) + PARAM(13); \
    for (int d = (top); d >= 0; --d) { \
        const int n = T_DIM(1, d); \
        const int i = rem % n; \
        rem /= n; \
        s += i * PARAM(d); \
        o += i * PARAM(7 + d); \
    }

#ifdef CONVERT
#define COPY_STORE(o, s) STORE_TD(dst, (o), CONVERT(LOAD_TS(src, (s))))
KERNEL(copy_strided)(OPTIONAL_SHAPE_INFO_ARG __global const TS* src, __global TD* dst)
#else
#define COPY_STORE(o, s) (dst[o] = src[s])
KERNEL(copy_strided)(OPTIONAL_SHAPE_INFO_ARG __global const T* src, __global T* dst)
#endif
{
    const int gid = get_global_id(0);
    if (gid >= T_COUNT(1)) return;
    COPY_OFFSETS(gid, MAX_RANK - 1)
    COPY_STORE(o, s);
}

// copy_strided by rows (CPUs, COPY_ROWS): a work-item copies one row of the innermost dim of
// tensor 1, its W elements at source stride PARAM(5) and destination stride PARAM(12): one
// index decomposition per row, not per element (PoCL runs the divisions one value at a time).
#if COPY_ROWS
#ifdef CONVERT
KERNEL(copy_rows)(OPTIONAL_SHAPE_INFO_ARG __global const TS* src, __global TD* dst)
#else
KERNEL(copy_rows)(OPTIONAL_SHAPE_INFO_ARG __global const T* src, __global T* dst)
#endif
{
    const int gid = get_global_id(0), W = T_DIM(1, MAX_RANK - 1);
    if (gid >= T_COUNT(1) / W) return;
    COPY_OFFSETS(gid, MAX_RANK - 2)
    const int ss = PARAM(5), ds = PARAM(12);
    for (int j = 0; j < W; ++j) COPY_STORE(o + j * ds, s + j * ss);
}
#endif
