// Tensors built or rearranged element by element: Range, Trilu, Tile, Pad. JIT: T element type.

// ---- Range: out[i] = start + i * delta (start and delta: one-element tensors 0 and 2) --------
// JIT: T's macros (T_C, LOAD_T, STORE_T; engine/f16.py type_jit).
#ifdef RANGE
KERNEL(range)(OPTIONAL_SHAPE_INFO_ARG __global const T* start, __global const T* limit,
              __global const T* delta, __global T* out)
{
    const int gid = get_global_id(0);
    if (gid >= T_COUNT(3)) return;
    // computed in T_C (float for half: the one rounding is the store's)
    STORE_T(out, T_OFF(3) + gid, LOAD_T(start, T_OFF(0)) + (T_C)gid * LOAD_T(delta, T_OFF(2)));
}
#endif

// ---- Trilu: keep the lower (UPPER 0) or upper (UPPER 1) triangle of the last two dims --------
// Tensors: 0 X, 1 Y. PARAM(0): the diagonal offset k.
#ifdef TRILU
KERNEL(trilu)(OPTIONAL_SHAPE_INFO_ARG __global const T* X, __global T* Y)
{
    const int gid = get_global_id(0);
    if (gid >= T_COUNT(1)) return;
    const int cols = T_DIM(1, MAX_RANK - 1), rows = T_DIM(1, MAX_RANK - 2);
    const int j = gid % cols, i = (gid / cols) % rows;
    const int keep = UPPER ? (j - i >= PARAM(0)) : (j - i <= PARAM(0));
    Y[T_OFF(1) + gid] = keep ? X[T_OFF(0) + gid] : (T)0;
}
#endif

// ---- Tile: out[p] = in[p mod in's dims] ------------------------------------------------------
// Tensors: 0 X, 1 Y.
#ifdef TILE
KERNEL(tile)(OPTIONAL_SHAPE_INFO_ARG __global const T* X, __global T* Y)
{
    const int gid = get_global_id(0);
    if (gid >= T_COUNT(1)) return;
    int rem = gid, off = 0, stride = 1;
    for (int d = MAX_RANK - 1; d >= 0; --d) {
        const int n = T_DIM(1, d), m = T_DIM(0, d);
        off += ((rem % n) % m) * stride;
        rem /= n;
        stride *= m;
    }
    Y[T_OFF(1) + gid] = X[T_OFF(0) + off];
}
#endif

// ---- Pad: modes constant (0), reflect (1), edge (2), wrap (3); negative pads crop -------------
// Tensors: 0 X, [1 value (HAS_VALUE)], last Y. PARAM(0..5): pads at the start of each aligned dim.
#ifdef PAD
KERNEL(pad)(OPTIONAL_SHAPE_INFO_ARG __global const T* X,
#if HAS_VALUE
            __global const T* value,
#endif
            __global T* Y)
{
    const int yt = 1 + HAS_VALUE;
    const int gid = get_global_id(0);
    if (gid >= T_COUNT(yt)) return;
    int rem = gid, off = 0, stride = 1, inside = 1;
    for (int d = MAX_RANK - 1; d >= 0; --d) {
        const int n = T_DIM(yt, d), m = T_DIM(0, d);
        int c = rem % n - PARAM(d);
        rem /= n;
        if (c < 0 || c >= m) {
            if (MODE == 0 || m == 0) inside = 0;
            else if (MODE == 2) c = clamp(c, 0, m - 1);
            else if (MODE == 3) c = ((c % m) + m) % m;
            else if (m == 1) c = 0;
            else {  // reflect without repeating the edge: period 2 * (m - 1)
                const int p = 2 * (m - 1);
                c = ((c % p) + p) % p;
                if (c >= m) c = p - c;
            }
        }
        off += c * stride;
        stride *= m;
    }
#if HAS_VALUE
    const T v = value[T_OFF(1)];
#else
    const T v = (T)(PAD_VALUE);
#endif
    Y[T_OFF(yt) + gid] = inside ? X[T_OFF(0) + off] : v;
}
#endif
