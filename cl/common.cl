// Shared by every kernel source. One source serves both builds (seed 003):
//  IS_DYNAMIC=1: dims come from the shape_info buffer, the first kernel argument;
//  IS_DYNAMIC=0: shape_info is a compile-time table (SHAPE_INFO_INIT), so dims fold to constants.
//  Static builds keep the runtime buffer as their first argument (same argument list as the
//  dynamic build) and read only the tensor offsets and RT_PARAMs from it: a view or an
//  in-place concat that moves an offset keeps its static impl, and fake-aligned builds
//  (GEMM rows rounded up) learn the real size there.
//
// shape_info layout (the engine writes it, engine/kernels.py): for each tensor argument in
// order, a block of 1 + MAX_RANK ints: [element offset, dims right-aligned to MAX_RANK (leading
// 1s)], then the op's integer parameters.
#define MAX_RANK 6
#define TBLOCK (MAX_RANK + 1)

#if IS_DYNAMIC
#define OPTIONAL_SHAPE_INFO_ARG __global const int* shape_info,
#define OPTIONAL_SHAPE_INFO_TENSOR shape_info,
#define SHAPE_INFO_PTR __global const int*
#else
#define OPTIONAL_SHAPE_INFO_ARG __global const int* shape_info_rt,
#define OPTIONAL_SHAPE_INFO_TENSOR shape_info_rt,
#define SHAPE_INFO_PTR __constant int*
__constant int shape_info[] = SHAPE_INFO_INIT;
#endif

#define KERNEL(name) __kernel void name
#if IS_DYNAMIC
#define T_OFF(t) (shape_info[(t) * TBLOCK])
#define RT_PARAM(i) PARAM(i)
#else
#define T_OFF(t) (shape_info_rt[(t) * TBLOCK])
#define RT_PARAM(i) (shape_info_rt[NUM_TENSORS * TBLOCK + (i)])
#endif
#define T_DIM(t, d) (shape_info[(t) * TBLOCK + 1 + (d)])
#define T_COUNT(t) (T_DIM(t, 0) * T_DIM(t, 1) * T_DIM(t, 2) * T_DIM(t, 3) * T_DIM(t, 4) * T_DIM(t, 5))
#define PARAM(i) (shape_info[NUM_TENSORS * TBLOCK + (i)])

// Offset of output element `o` (linear, no offset) in tensor `in_t` broadcast to tensor `out_t`.
inline int bcast_off(SHAPE_INFO_PTR si, int out_t, int in_t, int o) {
    int off = 0, s = 1;
    for (int d = MAX_RANK - 1; d >= 0; --d) {
        const int n = si[out_t * TBLOCK + 1 + d], m = si[in_t * TBLOCK + 1 + d];
        if (m != 1) off += (o % n) * s;
        o /= n;
        s *= m;
    }
    return off;
}

// Fused eltwise ops (engine/fusion.py): a kernel that supports them passes each output value
// through FUSED_OPS(v, o) before storing it (o: the element's linear index in the output, no
// offset) and ends its parameter list with FUSED_ARGS (the fused inputs' buffers). The engine
// defines FUSED_OPS_BODY / FUSED_PARAMS / FUSED_CALL when it fuses ops into the node; by
// default the hooks are no-ops.
#ifdef FUSED_OPS_BODY
#define HAS_FUSED_OPS 1
#define FUSED_ARGS FUSED_PARAMS
inline float fused_ops(float v0, int o, SHAPE_INFO_PTR si FUSED_PARAMS) { FUSED_OPS_BODY }
#define FUSED_OPS(v, o) fused_ops((v), (o), shape_info FUSED_CALL)
#else
#define HAS_FUSED_OPS 0
#define FUSED_OPS(v, o) (v)
#define FUSED_ARGS
#endif

// Prologue ops (engine/fusion.py prologue fusion, e.g. attention's scores * scale + mask feeding
// a Softmax): a kernel that supports them passes every value it reads from its input 0 through
// PROLOGUE_OPS(v, i) (i: the element's linear index in that input, no offset) and ends its
// parameter list with PROLOGUE_ARGS. Defined by PROLOGUE_OPS_BODY / PROLOGUE_PARAMS /
// PROLOGUE_CALL like the fused ops above; by default a no-op.
#ifdef PROLOGUE_OPS_BODY
#define PROLOGUE_ARGS PROLOGUE_PARAMS
inline float prologue_ops(float v0, int o, SHAPE_INFO_PTR si PROLOGUE_PARAMS) { PROLOGUE_OPS_BODY }
#define PROLOGUE_OPS(v, i) prologue_ops((v), (i), shape_info PROLOGUE_CALL)
#else
#define PROLOGUE_OPS(v, i) (v)
#define PROLOGUE_ARGS
#endif
