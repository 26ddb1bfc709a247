// Einsum as one contraction loop (engine/ops/einsum.py; the two-operand matrix products
// exporters emit run as MatMul instead). JIT: T element type, TACC accumulator, NUM_OPS 1..3.
// Letters: the output's first (NO of them, outermost first), then the summed ones (NL in all,
// at most 8). PARAM(0) NL, PARAM(1) NO, PARAM(2..9) extents, PARAM(10 + 8 t + j): the element
// stride of letter j in operand t (0: absent; a letter repeated in one operand sums its strides,
// which walks the diagonal).
#define EXT(j) PARAM(2 + (j))
#define STR(t, j) PARAM(10 + 8 * (t) + (j))

KERNEL(einsum)(OPTIONAL_SHAPE_INFO_ARG __global const T* in0,
#if NUM_OPS > 1
               __global const T* in1,
#endif
#if NUM_OPS > 2
               __global const T* in2,
#endif
               __global T* out)
{
    const int gid = get_global_id(0);
    if (gid >= T_COUNT(NUM_OPS)) return;
    const int NL = PARAM(0), NO = PARAM(1);
    int base[3] = {T_OFF(0), 0, 0};
#if NUM_OPS > 1
    base[1] = T_OFF(1);
#endif
#if NUM_OPS > 2
    base[2] = T_OFF(2);
#endif
    int rem = gid;
    for (int j = NO - 1; j >= 0; --j) {
        const int i = rem % EXT(j);
        rem /= EXT(j);
        for (int t = 0; t < NUM_OPS; ++t) base[t] += i * STR(t, j);
    }
    int inner = 1;
    for (int j = NO; j < NL; ++j) inner *= EXT(j);
    TACC acc = 0;
    for (int s = 0; s < inner; ++s) {
        int off[3] = {base[0], base[1], base[2]};
        int r = s;
        for (int j = NL - 1; j >= NO; --j) {
            const int i = r % EXT(j);
            r /= EXT(j);
            for (int t = 0; t < NUM_OPS; ++t) off[t] += i * STR(t, j);
        }
        TACC p = (TACC)in0[off[0]];
#if NUM_OPS > 1
        p *= (TACC)in1[off[1]];
#endif
#if NUM_OPS > 2
        p *= (TACC)in2[off[2]];
#endif
        acc += p;
    }
    out[T_OFF(NUM_OPS) + gid] = (T)acc;
}
