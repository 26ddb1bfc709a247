// Batched GEMM with numpy broadcasting over batch dims: Y = ALPHA * op(A) x op(B) + BETA * C.
// Tensors: 0 A [.., M, K] (or [.., K, M] with TRANS_A), 1 B [.., K, N] (or [.., N, K] with
// TRANS_B), [2 C bias, broadcast to Y], then Y [.., M, N].
// JIT: TRANS_A, TRANS_B, HAS_BIAS, ALPHA, BETA; the tile of gemm_lm (WGX, WGY, RM, RN, BK) or
// of gemm_rb (TM, TN, B_BLOCKED), chosen per device kind in engine/ops/matmul.py.
// PARAM(0) M, PARAM(1) N, PARAM(2) K, PARAM(3) batch count.
#if HAS_BIAS
#define Y_T 3
#define GEMM_BIAS_ARG __global const float* C,
#else
#define Y_T 2
#define GEMM_BIAS_ARG
#endif
// SPLIT_N (2 or 3): the output's N columns in SPLIT_N equal parts, each a tensor of its own
// (Y, then Y1, Y2 right after it): sibling projections of one input packed into one GEMM
// (engine/packed_projections.py). Y's shape_info dims are the packed [.., M, N].
#ifndef SPLIT_N
#define SPLIT_N 1
#endif
#if SPLIT_N == 3
#define GEMM_SPLIT_ARGS , __global float* Y1, __global float* Y2
#elif SPLIT_N == 2
#define GEMM_SPLIT_ARGS , __global float* Y1
#else
#define GEMM_SPLIT_ARGS
#endif
// The tensor arguments every GEMM kernel starts with, in the order the engine binds them.
#define GEMM_TENSORS __global const float* A, __global const float* B, GEMM_BIAS_ARG __global float* Y GEMM_SPLIT_ARGS

// Batch offsets: decompose the flat batch index over Y's batch dims (all but the last two),
// broadcasting A and B where their batch dim is 1.
// Matrix stride of operand t. Dynamic builds take it from the operand's dims, so a padded
// operand (the KV cache: more rows than used) is walked right; static tables hold fake-aligned
// rows and never see padded operands, so they use the real sizes.
#if IS_DYNAMIC
#define GEMM_MAT_STRIDE(t, dense) (T_DIM(t, MAX_RANK - 2) * T_DIM(t, MAX_RANK - 1))
#else
#define GEMM_MAT_STRIDE(t, dense) (dense)
#endif

#define GEMM_BATCH_OFFSETS(bat, M, N, K)                        \
    int a_off = T_OFF(0), b_off = T_OFF(1), y_off = T_OFF(Y_T); \
    {                                                           \
        int rem = bat, sy = M * N;                              \
        int sa = GEMM_MAT_STRIDE(0, M * K);                     \
        int sb = GEMM_MAT_STRIDE(1, K * N);                     \
        for (int d = MAX_RANK - 3; d >= 0; --d) {               \
            const int n = T_DIM(Y_T, d);                        \
            const int i = rem % n;                              \
            rem /= n;                                           \
            if (T_DIM(0, d) != 1) a_off += i * sa;              \
            if (T_DIM(1, d) != 1) b_off += i * sb;              \
            y_off += i * sy;                                    \
            sa *= T_DIM(0, d);                                  \
            sb *= T_DIM(1, d);                                  \
            sy *= n;                                            \
        }                                                       \
    }

// ALPHA * acc (+ BETA * C broadcast to [.., M, N]: Y's dims walked with C's right-aligned dims)
inline float gemm_epilogue(SHAPE_INFO_PTR si, __global const float* C, int c_off, float acc,
                           int idx) {
    float y = ALPHA * acc;
#if HAS_BIAS
    int rem = idx, off = 0, s = 1;
    for (int d = MAX_RANK - 1; d >= 0; --d) {
        const int n = si[Y_T * TBLOCK + 1 + d], m = si[2 * TBLOCK + 1 + d];
        const int i = rem % n;
        rem /= n;
        if (m != 1) off += i * s;
        s *= m;
    }
    y += BETA * C[c_off + off];
#endif
    return y;
}
#if HAS_BIAS
#define C_ARG C
#define C_OFF T_OFF(2)
#else
#define C_ARG ((__global const float*)0)
#define C_OFF 0
#endif

#if SPLIT_N > 1
#if SPLIT_N == 3
#define SPLIT_Y2 (Y2 + T_OFF(Y_T + 2))
#else
#define SPLIT_Y2 (Y1 + T_OFF(Y_T + 1))
#endif
// Where element (row, col) of the packed output [.., M, N] lives (yb: its batch's offset in the
// packed output, bat * M * N): part col / (N / SPLIT_N), at that part's own [.., M, N / SPLIT_N]
// position; y0, y1, y2: the parts at their offsets.
inline __global float* split_at(__global float* y0, __global float* y1, __global float* y2,
                                int yb, int row, int col, int N) {
    const int nh = N / SPLIT_N, w = col / nh;
    return (w == 0 ? y0 : w == 1 ? y1 : y2) + yb / SPLIT_N + row * nh + col - w * nh;
}
#define SPLIT_AT(yb, row, col, N) \
    split_at(Y + T_OFF(Y_T), Y1 + T_OFF(Y_T + 1), SPLIT_Y2, (yb), (row), (col), (N))
#define SPLIT_STORE(yb, row, col, N, v) *SPLIT_AT(yb, row, col, N) = (v);
#endif

// Split-K (GPUs), for few rows and a long K: S work-items (or work-groups of gemm_lm with
// LM_SPLIT) share the K loop of one output, each writing its partial sum into the internal
// buffer T [S, batch, M, N]; gemm_splitk_reduce adds the S partials and applies the epilogue
// and the fused ops. They take the GEMM's tensors plus T. PARAM(4): S.
// gemm_splitk_partial serves a decode step's GEMV (M <= SPLITK_ROWS, the engine's
// SPLITK_MAX_ROWS): a work-item sums K / S products for 4 columns (a float4 of B along N) of
// every row, so B is read once whatever M is.
#define T_T (Y_T + SPLIT_N)
#define SPLITK_ROWS 4
KERNEL(gemm_splitk_partial)(OPTIONAL_SHAPE_INFO_ARG GEMM_TENSORS, __global float* T)
{
    const int M = PARAM(0), N = PARAM(1), K = PARAM(2), NB = PARAM(3), S = PARAM(4);
    const int c0 = get_global_id(0) * 4, bat = get_global_id(2) % NB;
    const int split = get_global_id(2) / NB;
    if (c0 >= N) return;
    GEMM_BATCH_OFFSETS(bat, M, N, K)
    const int chunk = (K + S - 1) / S, k1 = min(K, (split + 1) * chunk), lim = N - c0;
#if !TRANS_B
    const int vb = ((b_off | N) & 3) == 0;
#endif
    float4 acc[SPLITK_ROWS];
#pragma unroll
    for (int i = 0; i < SPLITK_ROWS; ++i) acc[i] = (float4)(0.0f);
#pragma unroll 4
    for (int k = split * chunk; k < k1; ++k) {
#if TRANS_B
        float4 b = (float4)(0.0f);
        const __global float* bp = B + b_off + c0 * K + k;
        if (lim > 0) b.s0 = bp[0];
        if (lim > 1) b.s1 = bp[K];
        if (lim > 2) b.s2 = bp[2 * K];
        if (lim > 3) b.s3 = bp[3 * K];
#else
        const float4 b = ld4_lim(B + b_off + k * N + c0, lim, vb);
#endif
#pragma unroll
        for (int i = 0; i < SPLITK_ROWS; ++i) {
            if (i >= M) break;
#if TRANS_A
            const float a = A[a_off + k * M + i];
#else
            const float a = A[a_off + i * K + k];
#endif
            acc[i] = mad((float4)(a), b, acc[i]);
        }
    }
    for (int i = 0; i < M; ++i) {
        __global float* t = T + T_OFF(T_T) + ((split * NB + bat) * M + i) * N + c0;
        if (lim > 0) t[0] = acc[i].s0;
        if (lim > 1) t[1] = acc[i].s1;
        if (lim > 2) t[2] = acc[i].s2;
        if (lim > 3) t[3] = acc[i].s3;
    }
}

KERNEL(gemm_splitk_reduce)(OPTIONAL_SHAPE_INFO_ARG GEMM_TENSORS, __global const float* T FUSED_ARGS)
{
    const int total = PARAM(3) * PARAM(0) * PARAM(1), S = PARAM(4);
    const int o = get_global_id(0);
    if (o >= total) return;
    // 4 independent sums: 4 loads in flight per step, not one L2 round trip per split
    const __global float* t = T + T_OFF(T_T) + o;
    float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
    int s = 0;
    for (; s + 4 <= S; s += 4) {
        a0 += t[s * total];
        a1 += t[(s + 1) * total];
        a2 += t[(s + 2) * total];
        a3 += t[(s + 3) * total];
    }
    for (; s < S; ++s) a0 += t[s * total];
    const float acc = (a0 + a1) + (a2 + a3);
    Y[T_OFF(Y_T) + o] = FUSED_OPS(gemm_epilogue(shape_info, C_ARG, C_OFF, acc, o), o);
}

// Register-blocked GEMM, no local memory (CPUs: PoCL serialises work-group barriers). A
// work-item computes TM rows x TN columns: NV = TN / VW vectors of VW (FUSED_VW) lanes, one
// vector load of B per vector and k; a full tile applies its epilogue and fused ops by vectors.
// Shape-agnostic builds take any N (the last partial tile is loaded and stored per element);
// static builds bake M, N, K in. B_BLOCKED: B was reordered (update_weights) to
// [ceil(N/TN)][K][TN], zero-padded, so each k reads TN contiguous floats. Fake alignment: the
// build's PARAM(0) is M rounded up; the real M comes at run time (RT_PARAM(0)); rows >= M read
// a clamped row and are never stored.
// The grid runs rows first (dim 0: row blocks, dim 1: column blocks): the work-groups PoCL
// runs one after another share their column block's B panel while it is in cache. PoCL, same
// process alternating, load 1-2, columns first / rows first (us): 128x1536x384 934 / 790,
// 128x384x1536 493 / 427, 32x1536x384 284 / 258, 32x384x1536 286 / 247, 128x384x384 182 / 186.
#ifdef TN
#define RB_CAT_(a, b) a##b
#define RB_CAT(a, b) RB_CAT_(a, b)
#define VW FUSED_VW
#define NV (TN / VW)
#define BV RB_CAT(float, VW)
#define BVU FLOATU(VW)      // not vloadN (cl/common.cl): 128x384x384 8x16 684 -> 137 us
#define BLOAD(p) VLOADU(VW, p)
// gemm_epilogue of VW consecutive outputs idx.. of one row
inline BV gemm_vepilogue(SHAPE_INFO_PTR si, __global const float* C, int c_off, BV acc, int idx) {
    BV y = ALPHA * acc;
#if HAS_BIAS
    y += BETA * bcast_vload(si, Y_T, 2, C + c_off, idx);
#endif
    return y;
}

KERNEL(gemm_rb)(OPTIONAL_SHAPE_INFO_ARG GEMM_TENSORS FUSED_ARGS)
{
    const int M = RT_PARAM(0), N = PARAM(1), K = PARAM(2);
    const int m0 = get_global_id(0) * TM, n0 = get_global_id(1) * TN, bat = get_global_id(2);
    if (n0 >= N || m0 >= M) return;
    GEMM_BATCH_OFFSETS(bat, M, N, K)

    const __global float* ap[TM];
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int r = m0 + i < M ? m0 + i : M - 1;   // not min(): PoCL calls it out of line
#if TRANS_A
        ap[i] = A + a_off + r;
#else
        ap[i] = A + a_off + r * K;
#endif
    }
    BV acc[TM][NV];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < NV; ++j) acc[i][j] = (BV)(0.0f);
#if B_BLOCKED
    const __global float* bp = B + b_off + (n0 / TN) * K * TN;
#endif
    const int nl = N - n0 < TN ? N - n0 : TN;
    // unrolled by 4: BERT's GEMMs (12x32 tiles, PoCL) 7.97 -> 7.47 ms, same process; static
    // builds only: PoCL generates the code at the first launch, in the inference's path, and
    // the unrolled shape-agnostic kernel took it 1.6-4.9 s (README's encoder, empty caches)
#ifdef SHAPE_INFO_INIT
#pragma unroll 4
#endif
    for (int k = 0; k < K; ++k) {
        BV bv[NV];
#if B_BLOCKED
#pragma unroll
        for (int j = 0; j < NV; ++j) bv[j] = BLOAD(bp + k * TN + j * VW);
#else
#if !TRANS_B
        if (nl == TN) {
#pragma unroll
            for (int j = 0; j < NV; ++j) bv[j] = BLOAD(B + b_off + k * N + n0 + j * VW);
        } else   // the last columns of a shape-agnostic build (N % TN != 0)
#endif
        {   // B [N, K] (TRANS_B) or a partial tile: per element, zeros past N
            float t[TN];
#pragma unroll
            for (int l = 0; l < TN; ++l)
#if TRANS_B
                t[l] = l < nl ? B[b_off + (n0 + l) * K + k] : 0.0f;
#else
                t[l] = l < nl ? B[b_off + k * N + n0 + l] : 0.0f;
#endif
#pragma unroll
            for (int j = 0; j < NV; ++j) bv[j] = *(const BVU*)(t + j * VW);
        }
#endif
#pragma unroll
        for (int i = 0; i < TM; ++i) {
#if TRANS_A
            const BV a = (BV)(ap[i][k * M]);
#else
            const BV a = (BV)(ap[i][k]);
#endif
#pragma unroll
            for (int j = 0; j < NV; ++j) acc[i][j] = VMAD(VW, a, bv[j], acc[i][j]);
        }
    }
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int row = m0 + i;
        if (row >= M) break;
        const int o0 = y_off - T_OFF(Y_T) + row * N + n0;
        __global float* y = Y + y_off + row * N + n0;
#if SPLIT_N > 1
        {   // a full tile within one part: stored by vectors there
            const int nh = N / SPLIT_N, w = n0 / nh;
            if (nl == TN && (n0 + TN - 1) / nh == w) {
                __global float* yp = SPLIT_AT(y_off - T_OFF(Y_T), row, n0, N);
#pragma unroll
                for (int j = 0; j < NV; ++j)
                    *(__global BVU*)(yp + j * VW) = gemm_vepilogue(shape_info, C_ARG, C_OFF, acc[i][j], o0 + j * VW);
                continue;
            }
        }
#elif HAS_FUSED_VOPS
        if (nl == TN) {
#pragma unroll
            for (int j = 0; j < NV; ++j)
                *(__global BVU*)(y + j * VW) =
                    FUSED_VOPS(gemm_vepilogue(shape_info, C_ARG, C_OFF, acc[i][j], o0 + j * VW), o0 + j * VW);
            continue;
        }
#endif
        float t[TN];
#pragma unroll
        for (int j = 0; j < NV; ++j) *(BVU*)(t + j * VW) = acc[i][j];
        for (int l = 0; l < nl; ++l) {
#if SPLIT_N > 1
            SPLIT_STORE(y_off - T_OFF(Y_T), row, n0 + l, N, gemm_epilogue(shape_info, C_ARG, C_OFF, t[l], o0 + l))
#else
            y[l] = FUSED_OPS(gemm_epilogue(shape_info, C_ARG, C_OFF, t[l], o0 + l), o0 + l);
#endif
        }
    }
}
#endif

// ---- Register-tiled GEMMs. Both serve the shape-agnostic build (dims from
// shape_info, every edge checked) and the static one (same source, IS_DYNAMIC=0: the dims fold).


// Stores one output element through the epilogue (ALPHA, BETA * C) and the fused ops.
#if SPLIT_N > 1
#define GEMM_STORE(row, col, acc)                                                   \
    {                                                                               \
        const int o_ = y_off - T_OFF(Y_T) + (row) * N + (col);                      \
        SPLIT_STORE(y_off - T_OFF(Y_T), row, col, N,                                \
                    gemm_epilogue(shape_info, C_ARG, C_OFF, (acc), o_))             \
    }
#else
#define GEMM_STORE(row, col, acc)                                                   \
    {                                                                               \
        const int o_ = y_off - T_OFF(Y_T) + (row) * N + (col);                      \
        const float v_ = gemm_epilogue(shape_info, C_ARG, C_OFF, (acc), o_);        \
        Y[y_off + (row) * N + (col)] = FUSED_OPS(v_, o_);                           \
    }
#endif

// GPU: 2-level tiling. A work-group of WGX x WGY work-items computes a BM x BN block of one
// batch's output (BM = WGY * RM, BN = WGX * RN); K advances by BK through local memory, where
// A's tile is stored k-major so that both operands are read as float4 along the output dims.
// A work-item owns RM x RN outputs, in float4 groups strided by the work-group (rows
// (ib * WGY + ty) * 4 + v, columns (jb * WGX + tx) * 4 + v): its local reads are conflict-free
// 128-bit loads and its stores are coalesced. RM, RN: multiples of 4.
#ifdef WGX
#define BM (WGY * RM)
#define BN (WGX * RN)
#define NT (WGX * WGY)
#define LPA (BM + 4)   // local row pitch: + 4 spreads the transposing stores over the banks
#define LPB (BN + 4)
#define LA ((BM * BK / 4 + NT - 1) / NT)   // float4 loads of A's tile per work-item
#define LB ((BN * BK / 4 + NT - 1) / NT)

// One operand's tile into reg[]: O lines of C contiguous floats (the operand's rows from o0,
// bounded by olim; columns from c0, bounded by clim), one float4 per work-item and step.
#define GEMM_LOAD_TILE(reg, P, off, pitch, vec, O, o0, olim, C, c0, clim)                    \
    for (int r = 0; r < (O * C / 4 + NT - 1) / NT; ++r) {                                      \
        const int e = r * NT + tid, o = e / (C / 4), c = (e % (C / 4)) * 4;                    \
        const int lim = (e < O * C / 4 && (o0) + o < (olim)) ? (clim) - (c0) - c : 0;           \
        reg[r] = ld4_lim(P + off + ((o0) + o) * (pitch) + (c0) + c, lim, vec);                \
    }
// A's tile [BM rows][BK] at k0 into ra[], B's [BK][BN columns] into rb[], float4 along each
// operand's contiguous dim
#if TRANS_A
#define GEMM_LOAD_A(k0) GEMM_LOAD_TILE(ra, A, a_off, M, va, BK, k0, KE, BM, bm0, M)
#else
#define GEMM_LOAD_A(k0) GEMM_LOAD_TILE(ra, A, a_off, K, va, BM, bm0, M, BK, k0, KE)
#endif
#if TRANS_B
#define GEMM_LOAD_B(k0) GEMM_LOAD_TILE(rb, B, b_off, K, vb, BN, bn0, N, BK, k0, KE)
#else
#define GEMM_LOAD_B(k0) GEMM_LOAD_TILE(rb, B, b_off, N, vb, BK, k0, KE, BN, bn0, N)
#endif

// reg[] (as GEMM_LOAD_TILE read it: O lines of C floats) into the k-major local tile L (row
// pitch LP): as is when the lines are k (kt 0), transposed when they are the output dim (kt 1).
#define GEMM_STORE_TILE(reg, L, LP, O, C, kt)                                                \
    _Pragma("unroll") for (int r = 0; r < (O * C / 4 + NT - 1) / NT; ++r) {                   \
        const int e = r * NT + tid, o = e / (C / 4), c = (e % (C / 4)) * 4;                    \
        if ((O * C / 4) % NT && e >= O * C / 4) break;                                        \
        if (kt) {                                                                              \
            L[c * LP + o] = reg[r].s0;                                                         \
            L[(c + 1) * LP + o] = reg[r].s1;                                                   \
            L[(c + 2) * LP + o] = reg[r].s2;                                                   \
            L[(c + 3) * LP + o] = reg[r].s3;                                                   \
        } else {                                                                               \
            *(__local float4*)(L + o * LP + c) = reg[r];                                       \
        }                                                                                      \
    }

// LM_SPLIT: split-K, the work-groups of z = split * batch + bat sum K rows [split * PARAM(5),
// + PARAM(5)) into T (PARAM(5): a multiple of BK); gemm_splitk_reduce finishes.
__attribute__((reqd_work_group_size(WGX, WGY, 1)))
#if LM_SPLIT
KERNEL(gemm_lm)(OPTIONAL_SHAPE_INFO_ARG GEMM_TENSORS, __global float* T)
#else
KERNEL(gemm_lm)(OPTIONAL_SHAPE_INFO_ARG GEMM_TENSORS FUSED_ARGS)
#endif
{
    const int M = RT_PARAM(0), N = PARAM(1), K = PARAM(2);
    const int tx = get_local_id(0), ty = get_local_id(1), tid = ty * WGX + tx;
    const int bn0 = get_group_id(0) * BN, bm0 = get_group_id(1) * BM;
#if LM_SPLIT
    const int bat = get_group_id(2) % PARAM(3), split = get_group_id(2) / PARAM(3);
    const int KB = split * PARAM(5), KE = min(K, KB + PARAM(5));
#else
    const int bat = get_group_id(2), KB = 0, KE = K;
#endif
    GEMM_BATCH_OFFSETS(bat, M, N, K)
    // 128-bit global loads need the operand's offset and row pitch (its contiguous dim) to be
    // multiples of 4 floats
#if TRANS_A
    const int va = ((a_off | M) & 3) == 0;
#else
    const int va = ((a_off | K) & 3) == 0;
#endif
#if TRANS_B
    const int vb = ((b_off | K) & 3) == 0;
#else
    const int vb = ((b_off | N) & 3) == 0;
#endif

    __local float4 As4[BK * LPA / 4];
    __local float4 Bs4[BK * LPB / 4];
    __local float* As = (__local float*)As4;
    __local float* Bs = (__local float*)Bs4;

    float4 acc[RM][RN / 4];
#pragma unroll
    for (int i = 0; i < RM; ++i)
#pragma unroll
        for (int j = 0; j < RN / 4; ++j) acc[i][j] = (float4)(0.0f);

    // the next tile's global loads are issued before this tile's products (held in ra, rb)
    float4 ra[LA], rb[LB];
    GEMM_LOAD_A(KB)
    GEMM_LOAD_B(KB)
    for (int k0 = KB; k0 < KE; k0 += BK) {
#if TRANS_A
        GEMM_STORE_TILE(ra, As, LPA, BK, BM, 0)
#else
        GEMM_STORE_TILE(ra, As, LPA, BM, BK, 1)
#endif
#if TRANS_B
        GEMM_STORE_TILE(rb, Bs, LPB, BN, BK, 1)
#else
        GEMM_STORE_TILE(rb, Bs, LPB, BK, BN, 0)
#endif
        barrier(CLK_LOCAL_MEM_FENCE);
        if (k0 + BK < KE) {
#pragma unroll
            GEMM_LOAD_A(k0 + BK)
#pragma unroll
            GEMM_LOAD_B(k0 + BK)
        }
        TILE_PRODUCTS(As4, Bs4)
        barrier(CLK_LOCAL_MEM_FENCE);
    }
#pragma unroll
    for (int i = 0; i < RM; ++i) {
        const int row = bm0 + ((i / 4) * WGY + ty) * 4 + i % 4;
        if (row >= M) continue;
#pragma unroll
        for (int j = 0; j < RN / 4; ++j) {
            const int col = bn0 + (j * WGX + tx) * 4;
            const float4 v = acc[i][j];
#if LM_SPLIT
            __global float* t = T + T_OFF(T_T) + ((split * PARAM(3) + bat) * M + row) * N + col;
            if (col < N) t[0] = v.s0;
            if (col + 1 < N) t[1] = v.s1;
            if (col + 2 < N) t[2] = v.s2;
            if (col + 3 < N) t[3] = v.s3;
#else
            if (col < N) GEMM_STORE(row, col, v.s0)
            if (col + 1 < N) GEMM_STORE(row, col + 1, v.s1)
            if (col + 2 < N) GEMM_STORE(row, col + 2, v.s2)
            if (col + 3 < N) GEMM_STORE(row, col + 3, v.s3)
#endif
        }
    }
}
#endif

// ---- GEMV (GPUs): R = batch * M <= GV_ROWS rows of A times a B with no batch dims
// (a weight), bandwidth-bound: every byte of B is read once, coalesced, with several 128-bit
// loads in flight per work-item; the R rows of A are read through the cache (all the lanes of
// a K slice read the same elements). Rows past R repeat the last row and are never stored.
// The build computes GV_ROWS >= R rows. PARAM(0..3) M, N, K, batch count; PARAM(4) S, the K
// splits (the work-groups' z); PARAM(5) the K rows per split (a multiple of 4). GV_SPLIT: the splits write their partial sums to T
// [S, R, N] and gemm_splitk_reduce finishes (epilogue, fused ops); else S = 1 and the kernel
// stores Y through the epilogue and FUSED_OPS.
#if defined(GV_WX) || defined(GVT_WK)
#ifndef GV_ROWS   // rows the build computes: 1, 2 or 4 (engine/ops/matmul.py: R's bucket)
#define GV_ROWS 4
#endif
#ifndef GV_U   // quads of K rows a work-item loads per step (engine/ops/matmul.py GEMV_U)
#define GV_U 2
#endif
#if GV_SPLIT
#define GV_TAIL_ARGS , __global float* T
#else
#define GV_TAIL_ARGS FUSED_ARGS
#endif

// What both kernels start with: the dims, the split's K rows [kb, ke), the offsets of the R
// rows (ao[r] of row r's first element in A, yo[r] in Y), B's offset, whether A's quads are
// 128-bit loads (va).
#if TRANS_A
#define GV_VA 0
#else
#define GV_VA (((T_OFF(0) | K) & 3) == 0)
#endif
#define GV_SETUP                                                                        \
    const int M = PARAM(0), N = PARAM(1), K = PARAM(2), R = M * PARAM(3), CH = PARAM(5);  \
    const int split = get_group_id(2), kb = split * CH, ke = min(K, kb + CH);            \
    int ao[GV_ROWS], yo[GV_ROWS];                                                       \
    for (int r = 0; r < GV_ROWS; ++r) {                                                 \
        const int rr = min(r, R - 1), i_ = rr % M;                                      \
        int ar = T_OFF(0), yr = T_OFF(Y_T);                                             \
        if (PARAM(3) > 1) {   /* rows from a batch dim: walk it */                      \
            GEMM_BATCH_OFFSETS(rr / M, M, N, K)                                         \
            ar = a_off, yr = y_off;                                                     \
        }                                                                               \
        ao[r] = ar + (TRANS_A ? i_ : i_ * K);                                           \
        yo[r] = yr + i_ * N;                                                            \
    }                                                                                   \
    const int b_off = T_OFF(1), va = GV_VA;

// LayerNorm prologue (GV_LN, engine/ln_gemv_fusion.py): A is a LayerNormalization's input X
// and the kernel multiplies its normalised rows, never written: each work-group first takes the
// R rows' mean and 1 / stddev over K (two passes from cache, cl/norm.cl layer_norm's formula;
// JIT EPS), then reads A as (x - mean) * rstd * gamma + beta. Gamma and [beta] (K floats,
// GV_LN_BIAS) are the kernel's last tensors, from GV_LN_T. gemv only (MatMul's B [K, N]).
#ifndef GV_LN
#define GV_LN 0
#endif
#if GV_LN
#if GV_LN_BIAS
#define GV_LN_ARGS , __global const float* LG, __global const float* LB
#else
#define GV_LN_ARGS , __global const float* LG
#endif
#define GV_WG (GV_WX * GV_KY)
// the sum of v over the work-group's GV_WG work-items (a row per component)
inline float4 gv_wg_sum(__local float4* red, int lid, float4 v) {
    red[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lid < 32) {
        for (int j = lid + 32; j < GV_WG; j += 32) v += red[j];
        red[lid] = v;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    float4 s = (float4)(0.0f);
    for (int j = 0; j < min(32, GV_WG); ++j) s += red[j];
    barrier(CLK_LOCAL_MEM_FENCE);
    return s;
}
inline float gv_lane(float4 v, int r) { return r == 0 ? v.s0 : r == 1 ? v.s1 : r == 2 ? v.s2 : v.s3; }
#define GV_PACK(p) (float4)(p[0], p[min(1, GV_ROWS - 1)], p[min(2, GV_ROWS - 1)], p[min(3, GV_ROWS - 1)])
#define GV_LN_SETUP                                                                     \
    __local float4 ln_red[GV_WG];                                                       \
    float ln_mean[GV_ROWS], ln_rstd[GV_ROWS];                                           \
    {                                                                                   \
        const int lid = get_local_id(1) * get_local_size(0) + get_local_id(0);          \
        float p[GV_ROWS];                                                               \
        for (int r = 0; r < GV_ROWS; ++r) p[r] = 0.0f;                                  \
        for (int k = lid; k < K; k += GV_WG)                                            \
            for (int r = 0; r < GV_ROWS; ++r) p[r] += gv_x1(A, ao[r], k, M);            \
        const float4 sum = gv_wg_sum(ln_red, lid, GV_PACK(p));                          \
        for (int r = 0; r < GV_ROWS; ++r) {                                             \
            ln_mean[r] = gv_lane(sum, r) / (float)K;                                    \
            p[r] = 0.0f;                                                                \
        }                                                                               \
        for (int k = lid; k < K; k += GV_WG)                                            \
            for (int r = 0; r < GV_ROWS; ++r) {                                         \
                const float d = gv_x1(A, ao[r], k, M) - ln_mean[r];                     \
                p[r] += d * d;                                                          \
            }                                                                           \
        const float4 sq = gv_wg_sum(ln_red, lid, GV_PACK(p));                           \
        for (int r = 0; r < GV_ROWS; ++r) ln_rstd[r] = rsqrt(gv_lane(sq, r) / (float)K + EPS); \
    }                                                                                   \
    const int lg = T_OFF(GV_LN_T), lb = GV_LN_B_OFF, vg = ((lg | lb) & 3) == 0;
#if GV_LN_BIAS
#define GV_LN_B_OFF T_OFF(GV_LN_T + 1)
#define GV_LN_B4(k) ld4_lim(LB + lb + (k), 4, vg)
#define GV_LN_B1(k) LB[lb + (k)]
#else
#define GV_LN_B_OFF 0
#define GV_LN_B4(k) (float4)(0.0f)
#define GV_LN_B1(k) 0.0f
#endif
// row r of A at k..k+3 (GV_A4) and at k (GV_A1), normalised
#define GV_A4(r, k) ((gv_x4(A, ao[r], (k), M, va) - ln_mean[r]) * ln_rstd[r] * ld4_lim(LG + lg + (k), 4, vg) + GV_LN_B4(k))
#define GV_A1(r, k) ((gv_x1(A, ao[r], (k), M) - ln_mean[r]) * ln_rstd[r] * LG[lg + (k)] + GV_LN_B1(k))
#else
#define GV_LN_ARGS
#define GV_LN_SETUP
#define GV_A4(r, k) gv_x4(A, ao[r], (k), M, va)
#define GV_A1(r, k) gv_x1(A, ao[r], (k), M)
#endif

// Whether quad u of a step (quads `step` rows apart from k) is a whole quad of the split.
#define GV_OK(u, step) ((u) == 0 || k + (u) * (step) + 4 <= ke)

// A's elements k..k+3 of the row at o (va: one 128-bit load).
inline float4 gv_x4(const __global float* A, int o, int k, int M, int va) {
#if TRANS_A
    return (float4)(A[o + k * M], A[o + (k + 1) * M], A[o + (k + 2) * M], A[o + (k + 3) * M]);
#else
    return ld4_lim(A + o + k, 4, va);
#endif
}
inline float gv_x1(const __global float* A, int o, int k, int M) {
    return TRANS_A ? A[o + k * M] : A[o + k];
}

// The work-item's value v of row r at output column col: into T (split) or through the
// epilogue and the fused ops into Y.
#if GV_SPLIT
#define GV_STORE(r, col, v) T[T_OFF(T_T) + (split * R + (r)) * N + (col)] = (v);
#else
#define GV_STORE(r, col, v)                                                    \
    {                                                                          \
        const int o_ = yo[r] - T_OFF(Y_T) + (col);                             \
        Y[yo[r] + (col)] = FUSED_OPS(gemm_epilogue(shape_info, C_ARG, C_OFF, (v), o_), o_); \
    }
#endif
#endif

// B [K, N] (row-major, the ONNX MatMul weight): a work-group of GV_WX x GV_KY work-items
// covers 4 * GV_WX columns and the split's K rows; work-item (x, y) owns 4 columns and the
// quads of rows k = kb + 4 * (y + j * GV_KY). A warp's loads of one row are contiguous: a
// float4 per lane (columns 4x..4x+3) when B's rows are 16-byte aligned (N % 4 == 0), else a
// float per lane and component (columns x + j * GV_WX). The GV_KY slices' sums meet in local
// memory; work-items y < R finish row y.
#ifdef GV_WX
#if GV_KY & (GV_KY - 1)
#error "GV_KY must be a power of two (the slices' tree reduction)"
#endif
// 4 floats of one row of B, cs apart, the first lim of them in bounds
inline float4 gv_ldcol(const __global float* p, int lim, int cs) {
    float4 v = (float4)(0.0f);
    if (lim > 0) v.s0 = p[0];
    if (lim > 1) v.s1 = p[cs];
    if (lim > 2) v.s2 = p[2 * cs];
    if (lim > 3) v.s3 = p[3 * cs];
    return v;
}
// One step: GV_U quads of rows, quad u at k + u * 4 * GV_KY; B's 4 * GV_U loads first (LOADB
// of row kq), then every row's products: 4 * GV_U 128-bit loads in flight per work-item. Quads
// past the split's last whole quad (GV_OK false) load nothing: a work-item's last step, however
// short, still issues its loads together (no single-quad loop after it, one latency each).
#define GV_QUADS(LOADB)                                                                 \
    {                                                                                   \
        float4 b[4 * GV_U];                                                             \
        _Pragma("unroll") for (int u = 0; u < GV_U; ++u)                                \
            _Pragma("unroll") for (int q = 0; q < 4; ++q) {                             \
                const int kq = k + u * 4 * GV_KY + q;                                   \
                b[u * 4 + q] = GV_OK(u, 4 * GV_KY) ? LOADB : (float4)(0.0f);            \
            }                                                                           \
        _Pragma("unroll") for (int u = 0; u < GV_U; ++u) {                              \
            if (!GV_OK(u, 4 * GV_KY)) break;                                            \
            _Pragma("unroll") for (int r = 0; r < GV_ROWS; ++r) {                       \
                const float4 x = GV_A4(r, k + u * 4 * GV_KY);             \
                acc[r] = mad((float4)(x.s0), b[u * 4], mad((float4)(x.s1), b[u * 4 + 1], \
                         mad((float4)(x.s2), b[u * 4 + 2], mad((float4)(x.s3), b[u * 4 + 3], acc[r])))); \
            }                                                                           \
        }                                                                               \
    }
__attribute__((reqd_work_group_size(GV_WX, GV_KY, 1)))
KERNEL(gemv)(OPTIONAL_SHAPE_INFO_ARG GEMM_TENSORS GV_TAIL_ARGS GV_LN_ARGS)
{
    GV_SETUP
    GV_LN_SETUP
    const int lx = get_local_id(0), ky = get_local_id(1);
    const int vb = ((b_off | N) & 3) == 0;
    const int g0 = get_group_id(0) * GV_WX * 4;
    const int cs = vb ? 1 : GV_WX;                 // column step between the 4 components
    const int c0 = vb ? g0 + lx * 4 : g0 + lx;
    const int lim = c0 < N ? min(4, (N - c0 + cs - 1) / cs) : 0;
    const __global float* bp = B + b_off + c0;

    float4 acc[GV_ROWS];
#pragma unroll
    for (int r = 0; r < GV_ROWS; ++r) acc[r] = (float4)(0.0f);
    // the loop twice, so that neither has a branch on the load kind
    if (vb) {
        for (int k = kb + 4 * ky; k + 4 <= ke; k += 4 * GV_KY * GV_U) GV_QUADS(ld4_lim(bp + kq * N, lim, 1))
    } else {
        for (int k = kb + 4 * ky; k + 4 <= ke; k += 4 * GV_KY * GV_U) GV_QUADS(gv_ldcol(bp + kq * N, lim, cs))
    }
    // the split's last rows when they are not a whole quad (K % 4): that quad's slice
    const int kp = ke - ((ke - kb) & 3);
    if (kp < ke && ((kp - kb) / 4) % GV_KY == ky) {
        for (int k = kp; k < ke; ++k) {
            const float4 b = gv_ldcol(bp + k * N, lim, cs);
#pragma unroll
            for (int r = 0; r < GV_ROWS; ++r) acc[r] = mad((float4)(GV_A1(r, k)), b, acc[r]);
        }
    }

    // the GV_KY slices' sums: a tree in local memory (GV_KY a power of two), row r's total
    // ends in slice 0, which work-item y = r stores
    __local float4 red[GV_KY * GV_ROWS * GV_WX];
#pragma unroll
    for (int r = 0; r < GV_ROWS; ++r) red[(ky * GV_ROWS + r) * GV_WX + lx] = acc[r];
    for (int h = GV_KY / 2; h > 0; h >>= 1) {
        barrier(CLK_LOCAL_MEM_FENCE);
        if (ky < h) {
#pragma unroll
            for (int r = 0; r < GV_ROWS; ++r)
                red[(ky * GV_ROWS + r) * GV_WX + lx] += red[((ky + h) * GV_ROWS + r) * GV_WX + lx];
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    // the R rows' 4 * GV_WX values, a value per work-item (the epilogue and fused ops read
    // their operands one dependent load after another: 4 * R values on one work-item of slice
    // 0 made GPT-2's MLP up projection with its GELU chain 19 us against 11 for the QKV one)
    const __local float* sums = (const __local float*)red;     // row r's float4 x at r * GV_WX + x
    for (int o = ky * GV_WX + lx; o < R * 4 * GV_WX; o += GV_WX * GV_KY) {
        const int r = o / (4 * GV_WX), x = (o / 4) % GV_WX, comp = o & 3;
        const int col = (vb ? g0 + x * 4 : g0 + x) + comp * cs;
        if (col < N) GV_STORE(r, col, sums[o])
    }
}
#endif

// B [N, K] (TRANS_B, Gemm's transB weight): a work-group of GVT_WK x GVT_NC work-items covers
// GVT_NC columns, each a row of B read along K by GVT_WK lanes (a float4 of K each, quads
// k = kb + 4 * (x + j * GVT_WK)); the lanes' sums meet in local memory.
#ifdef GVT_WK
__attribute__((reqd_work_group_size(GVT_WK, GVT_NC, 1)))
KERNEL(gemv_t)(OPTIONAL_SHAPE_INFO_ARG GEMM_TENSORS GV_TAIL_ARGS)
{
    GV_SETUP
    const int lk = get_local_id(0), nc = get_local_id(1), n = get_group_id(0) * GVT_NC + nc;
    const int vb = ((b_off | K) & 3) == 0;
    const __global float* bp = B + b_off + min(n, N - 1) * K;

    float acc[GV_ROWS];
#pragma unroll
    for (int r = 0; r < GV_ROWS; ++r) acc[r] = 0.0f;
    // steps of GV_U quads (all loads first; quads past the last whole one load nothing)
    for (int k = kb + 4 * lk; k + 4 <= ke; k += 4 * GVT_WK * GV_U) {
        float4 b[GV_U];
#pragma unroll
        for (int u = 0; u < GV_U; ++u)
            b[u] = GV_OK(u, 4 * GVT_WK) ? ld4_lim(bp + k + u * 4 * GVT_WK, 4, vb) : (float4)(0.0f);
#pragma unroll
        for (int u = 0; u < GV_U; ++u) {
            if (!GV_OK(u, 4 * GVT_WK)) break;
#pragma unroll
            for (int r = 0; r < GV_ROWS; ++r) acc[r] += dot(gv_x4(A, ao[r], k + u * 4 * GVT_WK, M, va), b[u]);
        }
    }
    const int kp = ke - ((ke - kb) & 3);   // the last rows, not a whole quad: that quad's lane
    if (kp < ke && ((kp - kb) / 4) % GVT_WK == lk) {
        for (int k = kp; k < ke; ++k) {
            const float b = bp[k];
#pragma unroll
            for (int r = 0; r < GV_ROWS; ++r) acc[r] = mad(gv_x1(A, ao[r], k, M), b, acc[r]);
        }
    }

    __local float red[GVT_NC * GV_ROWS * GVT_WK];
#pragma unroll
    for (int r = 0; r < GV_ROWS; ++r) red[(nc * GV_ROWS + r) * GVT_WK + lk] = acc[r];
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lk < R && lk < GV_ROWS && n < N) {
        float s = 0.0f;
        for (int j = 0; j < GVT_WK; ++j) s += red[(nc * GV_ROWS + lk) * GVT_WK + j];
        GV_STORE(lk, n, s)
    }
}
#endif
