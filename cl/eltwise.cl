// N-ary elementwise op with numpy broadcasting (NUM_INPUTS 0..5).
// JIT: NUM_INPUTS, T0..T4 input types, TOUT, OPERATION(a, b, c, d, e): the C expression over
// the values in their compute types (T0_C.., TOUT_C: float for half; cl/common.cl LOAD_/STORE_).
// PARAM(0): 1 when no input broadcasts (every input has the output's shape): flat indexing.
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
    if (gid >= T_COUNT(NUM_INPUTS)) return;
    int off[5] = {0, 0, 0, 0, 0};
    if (PARAM(0)) {
        for (int t = 0; t < NUM_INPUTS; ++t) off[t] = gid;
    } else {
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
    }
#if NUM_INPUTS > 0
    const T0_C a = LOAD_T0(in0, T_OFF(0) + off[0]);
#else
    const float a = 0;
#endif
#if NUM_INPUTS > 1
    const T1_C b = LOAD_T1(in1, T_OFF(1) + off[1]);
#else
    const float b = 0;
#endif
#if NUM_INPUTS > 2
    const T2_C c = LOAD_T2(in2, T_OFF(2) + off[2]);
#else
    const float c = 0;
#endif
#if NUM_INPUTS > 3
    const T3_C d = LOAD_T3(in3, T_OFF(3) + off[3]);
#else
    const float d = 0;
#endif
#if NUM_INPUTS > 4
    const T4_C e = LOAD_T4(in4, T_OFF(4) + off[4]);
#else
    const float e = 0;
#endif
    STORE_TOUT(out, T_OFF(NUM_INPUTS) + gid, FUSED_OPS(OPERATION(a, b, c, d, e), gid));
}
