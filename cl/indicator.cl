// Tensors of ones at chosen positions (engine/ops/indicator.py): EyeLike and OneHot.
// JIT: T the output's storage type, LOAD_T / STORE_T (cl/common.cl).

// ---- EyeLike: Y [rows, cols], 1 where col - row == k. PARAM(0) k -----------------------------
#ifdef EYE_LIKE
KERNEL(eye_like)(OPTIONAL_SHAPE_INFO_ARG __global T* Y)
{
    const int gid = get_global_id(0);
    const int cols = T_DIM(0, MAX_RANK - 1);
    if (gid >= T_COUNT(0)) return;
    const int r = gid / cols, c = gid - r * cols;
    STORE_T(Y, T_OFF(0) + gid, c - r == PARAM(0) ? 1 : 0);
}
#endif

// ---- OneHot: Y viewed as [outer, depth, inner], indices as [outer, inner] --------------------
// Y = values[1] where (long)index (plus depth when negative) == its position along depth, else
// values[0]; an index outside -depth..depth-1 matches nowhere. JIT: TI the index type.
// Tensors: 0 indices, 1 values (2 elements), 2 Y. PARAM(0) depth, PARAM(1) inner.
#ifdef ONE_HOT
KERNEL(one_hot)(OPTIONAL_SHAPE_INFO_ARG __global const TI* I, __global const T* V, __global T* Y)
{
    const int gid = get_global_id(0);
    if (gid >= T_COUNT(2)) return;
    const int depth = PARAM(0), inner = PARAM(1);
    const int o = gid / (depth * inner), rest = gid - o * depth * inner;
    const int d = rest / inner, i = rest - d * inner;
    long idx = (long)I[T_OFF(0) + o * inner + i];
    if (idx < 0) idx += depth;
    Y[T_OFF(2) + gid] = V[T_OFF(1) + (idx == d ? 1 : 0)];
}
#endif
