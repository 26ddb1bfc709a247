// Shared by every kernel source. One source serves both builds (the GPU plugin's dynamic_impl.md):
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
#ifdef cl_khr_fp64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif
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
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)   // paste after expanding: CAT(float, 8) -> float8
// floatN at 4-byte alignment (FLOATU(8): float8_u): dereferenced, one unaligned vector load or
// store. CPU kernels use them for vloadN / vstoreN, which PoCL 3.0 calls out of line, and no
// vector register survives a call (gemm_rb 128x384x384: 684 us with vload16, 137 us without).
typedef float4 __attribute__((aligned(4))) float4_u;
typedef float8 __attribute__((aligned(4))) float8_u;
typedef float16 __attribute__((aligned(4))) float16_u;
#define FLOATU(n) CAT(CAT(float, n), _u)
#define VLOADU(n, p) (*(const __global FLOATU(n)*)(p))
#define VSTOREU(n, v, p) (*(__global FLOATU(n)*)(p) = (v))
// VMAD(w, a, b, c): mad(a, b, c) of w-lane vectors. At w = 16 (512 bits) it is spelled a * b + c
// (contracted by the compiler): PoCL's LLVM 14 cannot select mad or fma of 512-bit vectors for
// AVX-512 CPUs ("Cannot select: i64 = fadd" in _cl_madDv16_f, AMD Zen 4) and aborts the process.
#define VMAD_1(a, b, c) mad(a, b, c)
#define VMAD_2(a, b, c) mad(a, b, c)
#define VMAD_3(a, b, c) mad(a, b, c)
#define VMAD_4(a, b, c) mad(a, b, c)
#define VMAD_8(a, b, c) mad(a, b, c)
#define VMAD_16(a, b, c) ((a) * (b) + (c))
#define VMAD(w, a, b, c) CAT(VMAD_, w)(a, b, c)
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

// The products of one local tile (gemm_lm and conv_lm): RM x RN accumulators per work-item,
// acc[RM][RN / 4] as float4 columns, over the BK rows of A's tile As4 (pitch LPA, rows
// i * WGY + ty) and B's tile Bs4 (pitch LPB, columns j * WGX + tx).
#define TILE_PRODUCTS(As4, Bs4) \
    _Pragma("unroll") for (int k = 0; k < BK; ++k) { \
        float4 a[RM / 4], b[RN / 4]; \
        _Pragma("unroll") for (int i = 0; i < RM / 4; ++i) a[i] = As4[(k * LPA) / 4 + i * WGY + ty]; \
        _Pragma("unroll") for (int j = 0; j < RN / 4; ++j) b[j] = Bs4[(k * LPB) / 4 + j * WGX + tx]; \
        _Pragma("unroll") for (int i = 0; i < RM / 4; ++i) \
            _Pragma("unroll") for (int j = 0; j < RN / 4; ++j) { \
                acc[i * 4 + 0][j] = mad((float4)(a[i].s0), b[j], acc[i * 4 + 0][j]); \
                acc[i * 4 + 1][j] = mad((float4)(a[i].s1), b[j], acc[i * 4 + 1][j]); \
                acc[i * 4 + 2][j] = mad((float4)(a[i].s2), b[j], acc[i * 4 + 2][j]); \
                acc[i * 4 + 3][j] = mad((float4)(a[i].s3), b[j], acc[i * 4 + 3][j]); \
            } \
    }

// Loads 4 consecutive floats from p, the first `lim` of them in bounds (zeros past them). `vec`:
// p is 16-byte aligned (the operand's offset and row pitch are multiples of 4), so a full
// vector is one 128-bit load.
inline float4 ld4_lim(const __global float* p, int lim, int vec) {
    if (vec && lim >= 4) return *(const __global float4*)p;
    float4 v = (float4)(0.0f);
    if (lim > 0) v.s0 = p[0];
    if (lim > 1) v.s1 = p[1];
    if (lim > 2) v.s2 = p[2];
    if (lim > 3) v.s3 = p[3];
    return v;
}

// An index out of range (engine/index_flags.py): the first work-item of the node to find one
// records it in the node's slot [found, index column, index low bits, high bits], from which the
// host refuses the inference; the kernel goes on with a clamped index (no access outside).
inline void flag_index(__global int* slot, long idx, int column) {
    if (atomic_cmpxchg((volatile __global int*)slot, 0, 1) == 0) {
        slot[1] = column;
        slot[2] = (int)idx;
        slot[3] = (int)(idx >> 32);
    }
}

// How tensor `in_t` broadcasts to tensor `out_t`, for the common operands of fused epilogues:
// BCAST_SCALAR (one element), BCAST_SAME (the output's own shape), BCAST_ROW (a vector along the
// last dim of both, e.g. a bias), else BCAST_ANY.
#define BCAST_SCALAR 0
#define BCAST_SAME 1
#define BCAST_ROW 2
#define BCAST_ANY 3
inline int bcast_kind(SHAPE_INFO_PTR si, int out_t, int in_t) {
    int cnt = 1, same = 1;
    for (int d = 0; d < MAX_RANK; ++d) {
        const int m = si[in_t * TBLOCK + 1 + d];
        cnt *= m;
        same &= m == si[out_t * TBLOCK + 1 + d];
    }
    if (cnt == 1) return BCAST_SCALAR;
    if (same) return BCAST_SAME;
    if (cnt == si[in_t * TBLOCK + MAX_RANK] && cnt == si[out_t * TBLOCK + MAX_RANK]) return BCAST_ROW;
    return BCAST_ANY;
}

// Offset of output element `o` (linear, no offset) in tensor `in_t` broadcast to tensor `out_t`.
inline int bcast_off(SHAPE_INFO_PTR si, int out_t, int in_t, int o) {
    // without a division for the common operands of fused epilogues: a scalar, the output's
    // own shape, a vector along the last dim (a bias). The general walk divides twice per dim:
    // 4 such operands per value (a GELU chain) made a fused 128x1536x384 MatMul 25x slower.
    const int kind = bcast_kind(si, out_t, in_t);
    if (kind == BCAST_SCALAR) return 0;
    if (kind == BCAST_SAME) return o;
    if (kind == BCAST_ROW) return o % si[in_t * TBLOCK + MAX_RANK];
    int off = 0, s = 1;
    for (int d = MAX_RANK - 1; d >= 0; --d) {
        const int n = si[out_t * TBLOCK + 1 + d], m = si[in_t * TBLOCK + 1 + d];
        if (m != 1) off += (o % n) * s;
        o /= n;
        s *= m;
    }
    return off;
}

// erf for the Erf op (and the GELU chains fused into GEMMs), with no library call: PoCL's erf
// took 138 ns per value on the 2-core CI CPU (a MatMul 128x1536x384 with its fused GELU: 40 ms,
// 0.9 ms without), and its scalar exp was as slow inside a GEMM epilogue. Odd Taylor series
// below 0.5 (relative error < 2e-8); above, 1 - exp(-x^2) times a degree-5 polynomial in
// 1 / (1 + p |x|) (Abramowitz & Stegun 7.1.26, absolute error < 1.5e-7), exp(y) = 2^i * 2^f
// with 2^f (|f| <= 1/2) from its degree-7 Taylor polynomial.
#define EXP2_FRAC(f) (1.0f + (f) * (1.0f + (f) * (0.5f + (f) * (0.1666666667f + (f) * (0.0416666667f \
                      + (f) * (0.0083333333f + (f) * (0.0013888889f + (f) * 0.0001984127f)))))))
#define ERF_SMALL(x, z) ((x) * (1.1283791671f + (z) * (-0.3761263890f + (z) * (0.1128379167f \
                         + (z) * (-0.0268661706f + (z) * (0.0052239776f + (z) * (-0.0008548327f \
                         + (z) * 0.0001205533f)))))))
#define ERF_TAIL(t) ((t) * (0.254829592f + (t) * (-0.284496736f + (t) * (1.421413741f \
                     + (t) * (-1.453152027f + (t) * 1.061405429f)))))
inline float exp_f32(float y) {
    const float z = clamp(y * 1.4426950409f, -126.0f, 127.0f);
    const float i = rint(z), f = (z - i) * 0.6931471806f;
    const float p = EXP2_FRAC(f);
    return p * as_float(((int)i + 127) << 23);
}
inline float erf_f32(float x) {
    const float ax = fabs(x);
    if (ax < 0.5f) {
        const float z = x * x;
        return ERF_SMALL(x, z);
    }
    const float t = 1.0f / (1.0f + 0.3275911f * ax);
    const float poly = ERF_TAIL(t);
    return copysign(1.0f - poly * exp_f32(-ax * ax), x);
}

// Fused eltwise ops (engine/fusion.py): a kernel that supports them passes each output value
// through FUSED_OPS(v, o) before storing it (o: the element's linear index in the output, no
// offset) and ends its parameter list with FUSED_ARGS (the fused inputs' buffers). The engine
// defines FUSED_OPS_BODY / FUSED_PARAMS / FUSED_CALL when it fuses ops into the node; by
// default the hooks are no-ops.
//
// A kernel that knows its output element's coordinates in a rank <= 4 output (e.g. a conv's
// n, c, y, x) defines FUSED_COORDS 1 and calls FUSED_OPS_AT(v, o, (int4)(n, c, y, x)): the
// operands' broadcast offsets (FUSED_OFF) then need no division per element (bcast_off4);
// with FUSED_OPS(v, o) they come from the linear index (bcast_off: a division per dim).
// OUT_COORDS(n, c, y, x): the c4 of an NCHW output element. A 1-D conv (CONV1D) runs as 2-D
// with a unit height: its output [N, OC, L] and the fused operands (rank <= 3) index as
// [1, N, OC, L], so their coordinates are (0, n, c, x).
#if CONV1D
#define OUT_COORDS(n, c, y, x) (int4)(0, (n), (c), (x))
#else
#define OUT_COORDS(n, c, y, x) (int4)((n), (c), (y), (x))
#endif
#ifdef FUSED_OPS_BODY
#define HAS_FUSED_OPS 1
#define FUSED_ARGS FUSED_PARAMS
// Offset of the element at coordinates c4 of a rank <= 4 output in tensor `in_t` broadcast to it.
inline int bcast_off4(SHAPE_INFO_PTR si, int in_t, int4 c4) {
    const int b = in_t * TBLOCK + 1 + MAX_RANK - 4;
    const int n = si[b], c = si[b + 1], h = si[b + 2], w = si[b + 3];
    return (((n != 1 ? c4.s0 : 0) * c + (c != 1 ? c4.s1 : 0)) * h + (h != 1 ? c4.s2 : 0)) * w +
           (w != 1 ? c4.s3 : 0);
}
#if FUSED_COORDS
#define FUSED_OFF(si, out_t, in_t, o) bcast_off4(si, in_t, c4)
#else
#define FUSED_OFF(si, out_t, in_t, o) bcast_off(si, out_t, in_t, o)
#endif
inline float fused_ops(float v0, int o, int4 c4, SHAPE_INFO_PTR si FUSED_PARAMS) { FUSED_OPS_BODY }
#define FUSED_OPS(v, o) fused_ops((v), (o), (int4)(0), shape_info FUSED_CALL)
#define FUSED_OPS_AT(v, o, c4) fused_ops((v), (o), (c4), shape_info FUSED_CALL)
#else
#define HAS_FUSED_OPS 0
#define FUSED_OPS(v, o) (v)
#define FUSED_ARGS
#endif

// Vector epilogues (CPUs: gemm_rb defines FUSED_VW, its vector width): FUSED_VOPS(v, o) applies
// the fused ops to FUSED_VW consecutive outputs o.. of one row at once where the engine could
// write the chain over vectors (FUSED_VOPS_BODY, engine/fused_ops.py; HAS_FUSED_VOPS), else the
// kernel stores lane by lane through FUSED_OPS. PoCL runs a scalar chain as written, one value
// at a time (no vectoriser ran on it). No library call in exp_v / erf_v: PoCL 3.0 calls even
// fabs, rint and clamp out of line, and no vector register survives a call (the accumulators
// of the other rows spill).
#ifdef FUSED_VW
#define FVT CAT(float, FUSED_VW)
#define FVI CAT(int, FUSED_VW)
#define AS_FVT CAT(as_float, FUSED_VW)
#define AS_FVI CAT(as_int, FUSED_VW)
#define FVTU FLOATU(FUSED_VW)
// exp_f32 of each lane: 2^i from the bits of z + 1.5 * 2^23 (its low bits hold rint(z))
__attribute__((always_inline)) inline FVT exp_v(FVT y) {
    FVT z = y * 1.4426950409f;
    z = z > (FVT)(-126.0f) ? z : (FVT)(-126.0f);     // clamp, NaN to -126 as clamp does
    z = z < (FVT)(127.0f) ? z : (FVT)(127.0f);
    const FVT r = z + 12582912.0f, i = r - 12582912.0f, f = (z - i) * 0.6931471806f;
    return EXP2_FRAC(f) * AS_FVT((AS_FVI(r) - 0x4B400000 + 127) << 23);
}
// erf_f32 of each lane, both branches computed and selected
__attribute__((always_inline)) inline FVT erf_v(FVT x) {
    const FVI sign = AS_FVI(x) & (FVI)(0x80000000);
    const FVT ax = AS_FVT(AS_FVI(x) & (FVI)(0x7fffffff)), z = x * x;
    const FVT t = 1.0f / (1.0f + 0.3275911f * ax);
    const FVT big = AS_FVT((AS_FVI(1.0f - ERF_TAIL(t) * exp_v(-ax * ax)) & (FVI)(0x7fffffff)) | sign);
    return ax < (FVT)(0.5f) ? ERF_SMALL(x, z) : big;
}
// The values of tensor in_t (broadcast to out_t) at outputs o .. o + FUSED_VW - 1 of one row.
__attribute__((always_inline)) inline FVT bcast_vload(SHAPE_INFO_PTR si, int out_t, int in_t,
                                                      const __global float* F, int o) {
    const int kind = bcast_kind(si, out_t, in_t);
    if (kind == BCAST_SCALAR) return (FVT)(F[0]);
    if (kind == BCAST_SAME) return *(const __global FVTU*)(F + o);
    if (kind == BCAST_ROW) return *(const __global FVTU*)(F + o % si[in_t * TBLOCK + MAX_RANK]);
    float t[FUSED_VW];
    for (int l = 0; l < FUSED_VW; ++l) t[l] = F[bcast_off(si, out_t, in_t, o + l)];
    return *(const FVTU*)t;
}
#ifdef FUSED_VOPS_BODY
__attribute__((always_inline)) inline FVT fused_vops(FVT v0, int o, SHAPE_INFO_PTR si FUSED_PARAMS) {
    FUSED_VOPS_BODY
}
#define FUSED_VOPS(v, o) fused_vops((v), (o), shape_info FUSED_CALL)
#define HAS_FUSED_VOPS 1
#else
#define FUSED_VOPS(v, o) (v)
#define HAS_FUSED_VOPS (!HAS_FUSED_OPS)   // a chain with no vector body goes lane by lane
#endif
#endif

// Prologue ops (engine/fusion.py prologue fusion, e.g. attention's scores * scale + mask feeding
// a Softmax): a kernel that supports them reads its input PROLOGUE_REF in rows i0 + pa * step
// (pa = 0, 1, ...), declares the row once with PROLOGUE_ROW(i0, step, lin) and passes every value
// it reads through PROLOGUE_AT(v, pa, i) (i: the element's linear index, no offset); its
// parameter list ends with PROLOGUE_ARGS. `lin`: the row runs along one dim, so each operand's
// broadcast offset is linear in pa (computed once per row); else it is recomputed per read.
// Defined by PROLOGUE_OPS_BODY / PROLOGUE_PARAMS / PROLOGUE_CALL / PROLOGUE_REF /
// PROLOGUE_FIRST / PROLOGUE_NUM; by default a no-op.
#ifdef PROLOGUE_OPS_BODY
#define HAS_PROLOGUE 1
#define PROLOGUE_ARGS PROLOGUE_PARAMS
// ro[j], rs[j]: offset of operand j at row position 0 and its step per position (0: broadcast)
inline void prologue_row(SHAPE_INFO_PTR si, int i0, int step, int* ro, int* rs) {
    for (int j = 0; j < PROLOGUE_NUM; ++j) {
        const int t = PROLOGUE_FIRST + j;
        ro[j] = bcast_off(si, PROLOGUE_REF, t, i0);
        rs[j] = step ? bcast_off(si, PROLOGUE_REF, t, i0 + step) - ro[j] : 0;
    }
}
inline float prologue_ops(float v0, int pa, int i, int lin, SHAPE_INFO_PTR si, int* ro, int* rs
                          PROLOGUE_PARAMS) {
    if (!lin) {   // not along one dim: this read's own offsets
        prologue_row(si, i, 0, ro, rs);
        pa = 0;
    }
    PROLOGUE_OPS_BODY
}
#define PROLOGUE_ROW(i0, step, lin) \
    int p_ro[PROLOGUE_NUM + 1], p_rs[PROLOGUE_NUM + 1]; const int p_lin = (lin); \
    if (p_lin) prologue_row(shape_info, (i0), (step), p_ro, p_rs);
#define PROLOGUE_AT(v, pa, i) \
    prologue_ops((v), (pa), (i), p_lin, shape_info, p_ro, p_rs PROLOGUE_CALL)
#else
#define HAS_PROLOGUE 0
#define PROLOGUE_ROW(i0, step, lin)
#define PROLOGUE_AT(v, pa, i) (v)
#define PROLOGUE_ARGS
#endif

// Row kernels on GPUs (norm.cl, attention.cl; JIT LANES_REDUCE): the sum (is_max: the max) of v
// over the n lanes (a power of two) lid - sub .. lid - sub + n - 1 of the work-group; every one
// of them gets it. Called by the whole work-group (barriers); red holds a float per lane.
#ifdef LANES_REDUCE
inline float lanes_reduce(__local float* red, int lid, int sub, int n, float v, int is_max) {
    red[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int h = n / 2; h > 0; h >>= 1) {
        if (sub < h) red[lid] = is_max ? fmax(red[lid], red[lid + h]) : red[lid] + red[lid + h];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float r = red[lid - sub];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}
#endif

// float16 (engine/f16.py): half tensors are stored as half and computed as float on every
// device. vload_half / vstore_half are core OpenCL, so this needs no cl_khr_fp16 (NVIDIA's
// OpenCL and many PoCL builds lack it; there `half` may only be a pointer type). A kernel
// names each tensor's type through JIT constants made by engine.f16.type_jit("X", dtype):
//   X the storage type (half, float, long, ...), X_C its compute type (float for half),
//   LOAD_X(p, i) -> X_C, the element i of p; STORE_X(p, i, v) stores v (converted) at p[i].
// Pure copies need no conversion: they move f16 as ushort bits (engine.f16.bits_type).
#define LOAD_HALF(p, i) vload_half((i), (p))
#define STORE_HALF(p, i, v) vstore_half_rte((float)(v), (i), (p))
