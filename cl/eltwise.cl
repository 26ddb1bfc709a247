// N-ary elementwise op with numpy broadcasting (NUM_INPUTS 0..5).
// JIT: NUM_INPUTS, T0..T4 input types, TOUT, OPERATION(a, b, c, d, e): the C expression over
// the values in their compute types (T0_C.., TOUT_C: float for half; cl/common.cl LOAD_/STORE_).
// PARAM(0): 1 when no input broadcasts (every input has the output's shape): flat indexing,
// 4 consecutive elements per work-item, loaded and stored as vectors (ELT_VEC: no half tensor)
// when every tensor's offset is a multiple of 4 (an in-place concat slice may not be); else one
// element per work-item.
#define ELT_CAT_(a, b) a##b
#define ELT_CAT(a, b) ELT_CAT_(a, b)
#if NUM_INPUTS > 0
#define ELT_A(i) LOAD_T0(in0, T_OFF(0) + (i))
#else
#define ELT_A(i) 0.0f
#endif
#if NUM_INPUTS > 1
#define ELT_B(i) LOAD_T1(in1, T_OFF(1) + (i))
#else
#define ELT_B(i) 0.0f
#endif
#if NUM_INPUTS > 2
#define ELT_C(i) LOAD_T2(in2, T_OFF(2) + (i))
#else
#define ELT_C(i) 0.0f
#endif
#if NUM_INPUTS > 3
#define ELT_D(i) LOAD_T3(in3, T_OFF(3) + (i))
#else
#define ELT_D(i) 0.0f
#endif
#if NUM_INPUTS > 4
#define ELT_E(i) LOAD_T4(in4, T_OFF(4) + (i))
#else
#define ELT_E(i) 0.0f
#endif
#define ELT_STORE(i, v) STORE_TOUT(out, T_OFF(NUM_INPUTS) + (i), (v))
KERNEL(eltwise)(OPTIONAL_SHAPE_INFO_ARG
#if NUM_INPUTS > 0
    __global const T0* in0,
#endif
#if NUM_INPUTS > 1
    __global const T1* in1,
#endif
#if NUM_INPUTS > 2
    __global const T2* in2,
#endif
#if NUM_INPUTS > 3
    __global const T3* in3,
#endif
#if NUM_INPUTS > 4
    __global const T4* in4,
#endif
    __global TOUT* out FUSED_ARGS)
{
    const int gid = get_global_id(0);
    const int n = T_COUNT(NUM_INPUTS);
    if (PARAM(0)) {
        const int i = gid * 4;
        if (i >= n) return;
#if ELT_VEC
        int offs = T_OFF(NUM_INPUTS);
        for (int t = 0; t < NUM_INPUTS; ++t) offs |= T_OFF(t);
        if (i + 4 <= n && (offs & 3) == 0) {
#if NUM_INPUTS > 0
            const ELT_CAT(T0, 4) va = *(const __global ELT_CAT(T0, 4)*)(in0 + T_OFF(0) + i);
#else
            const float4 va = (float4)(0.0f);
#endif
#if NUM_INPUTS > 1
            const ELT_CAT(T1, 4) vb = *(const __global ELT_CAT(T1, 4)*)(in1 + T_OFF(1) + i);
#else
            const float4 vb = (float4)(0.0f);
#endif
#if NUM_INPUTS > 2
            const ELT_CAT(T2, 4) vc = *(const __global ELT_CAT(T2, 4)*)(in2 + T_OFF(2) + i);
#else
            const float4 vc = (float4)(0.0f);
#endif
#if NUM_INPUTS > 3
            const ELT_CAT(T3, 4) vd = *(const __global ELT_CAT(T3, 4)*)(in3 + T_OFF(3) + i);
#else
            const float4 vd = (float4)(0.0f);
#endif
#if NUM_INPUTS > 4
            const ELT_CAT(T4, 4) ve = *(const __global ELT_CAT(T4, 4)*)(in4 + T_OFF(4) + i);
#else
            const float4 ve = (float4)(0.0f);
#endif
            // component by component: OPERATION is scalar C (a vector `a == b` would give -1)
            ELT_CAT(TOUT, 4) r;
            r.s0 = FUSED_OPS(OPERATION(va.s0, vb.s0, vc.s0, vd.s0, ve.s0), i);
            r.s1 = FUSED_OPS(OPERATION(va.s1, vb.s1, vc.s1, vd.s1, ve.s1), i + 1);
            r.s2 = FUSED_OPS(OPERATION(va.s2, vb.s2, vc.s2, vd.s2, ve.s2), i + 2);
            r.s3 = FUSED_OPS(OPERATION(va.s3, vb.s3, vc.s3, vd.s3, ve.s3), i + 3);
            *(__global ELT_CAT(TOUT, 4)*)(out + T_OFF(NUM_INPUTS) + i) = r;
            return;
        }
#endif
        for (int g = i; g < min(i + 4, n); ++g)
            ELT_STORE(g, FUSED_OPS(OPERATION(ELT_A(g), ELT_B(g), ELT_C(g), ELT_D(g), ELT_E(g)), g));
        return;
    }
    if (gid >= n) return;
    int off[5] = {0, 0, 0, 0, 0};
    int stride[5] = {1, 1, 1, 1, 1};
    int rem = gid;
    for (int d = MAX_RANK - 1; d >= 0; --d) {
        const int od = T_DIM(NUM_INPUTS, d);
        const int i = rem % od;
        rem /= od;
        for (int t = 0; t < NUM_INPUTS; ++t) {
            const int id = T_DIM(t, d);
            if (id != 1) off[t] += i * stride[t];
            stride[t] *= id;
        }
    }
    ELT_STORE(gid, FUSED_OPS(OPERATION(ELT_A(off[0]), ELT_B(off[1]), ELT_C(off[2]),
                                       ELT_D(off[3]), ELT_E(off[4])), gid));
}
