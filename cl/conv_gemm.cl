// 2-D convolution, NCHW, on GPUs: an implicit GEMM with gemm_lm's 2-level tiling (cl/gemm.cl).
// Per image n and group g: Y[oc, p] = sum_k W[oc, k] * X'[k, p], k = (ic, ky, kx) over
// ICg * KH * KW, p = oy * OW + ox. A work-group of WGX x WGY work-items computes BM output
// channels x BN pixels (BM = WGY * RM, BN = WGX * RN), K stepped by BK through local memory.
// X' is never materialised: the B tile is gathered from X while loading it (im2col indices on
// the fly, zeros in the pads), each work-item loading 4 fixed pixels (their window origins
// computed once) of a few k rows per step.
// Tensors: 0 X [N, C, H, W], 1 W ([OC, ICg, KH, KW]; W_BLOCKED: the reordered
// [ceil(OC/BM), ICg*KH*KW, BM], zero-filled past OC: an A tile is BK x BM contiguous floats),
// [2 B [OC]], Y [N, OC, OH, OW], [T [S, N, OC, OH*OW] with CONV_SPLIT].
// JIT: WGX, WGY, RM, RN, BK (RM, RN multiples of 4); KH, KW, SY, SX, DY, DX (the weight's shape
//      and the attributes: constants of a model); HAS_BIAS, W_BLOCKED, FLAT (1x1, stride 1, no
//      pads: X' is X [ICg, H*W], 128-bit loads when aligned), CONV_SPLIT (the partial sums of
//      a split K into T; conv_split_reduce finishes).
// PARAM(0) pad top, (1) pad left, (2) OCg, (3) ICg, (4) group, (5) S (K splits), (6) K rows
// per split (a multiple of BK).
// Work: gws = (ceil(OH*OW / BN) * WGX, ceil(OCg / BM) * WGY, S * N * group), lws (WGX, WGY, 1).
#define Y_T (2 + HAS_BIAS)
#define T_T (Y_T + 1)
#define KWIN (KH * KW)

#ifdef WGX
#define BM (WGY * RM)
#define BN (WGX * RN)
#define NT (WGX * WGY)
#define LPA (BM + 4)   // local row pitch: + 4 spreads the transposing stores over the banks
#define LPB (BN + 4)
#define LA ((BM * BK / 4 + NT - 1) / NT)   // float4 loads of the A tile per work-item
#define BQ (BN / 4)                         // pixel quads of a B tile row
#define LB (BK * BQ / NT)                   // B tile rows a work-item loads per step
#if NT % BQ || (BK * BQ) % NT
#error "a work-item must load whole pixel quads of whole B tile rows"
#endif

#if CONV_SPLIT
#define CONV_TAIL_ARGS , __global float* T
#else
#define CONV_TAIL_ARGS FUSED_ARGS
#endif

// Element quad e of the A tile (weights, rows bm0.., k from k0) into a register: BM rows of BK
// floats along k (original layout), or BK rows of BM floats (W_BLOCKED, k-major already).
inline float4 conv_ld_a(const __global float* wb, int e, int k0, int KE, int KK, int bm0, int OCg,
                        int vec) {
#if W_BLOCKED
    const int k = e / (BM / 4), m = (e % (BM / 4)) * 4;
    if (e >= BM * BK / 4 || k0 + k >= KE) return (float4)(0.0f);
    return *(const __global float4*)(wb + (k0 + k) * BM + m);
#else
    const int o = e / (BK / 4), c = (e % (BK / 4)) * 4;
    const int lim = (e < BM * BK / 4 && bm0 + o < OCg) ? KE - k0 - c : 0;
    return ld4_lim(wb + (bm0 + o) * KK + k0 + c, lim, vec);
#endif
}

// The A registers into the k-major local tile: as is (W_BLOCKED) or transposed.
inline void conv_store_a(__local float* As, const float4* ra, int tid) {
#pragma unroll
    for (int r = 0; r < LA; ++r) {
        const int e = r * NT + tid;
        if ((BM * BK / 4) % NT && e >= BM * BK / 4) break;
#if W_BLOCKED
        *(__local float4*)(As + (e / (BM / 4)) * LPA + (e % (BM / 4)) * 4) = ra[r];
#else
        const int o = e / (BK / 4), c = (e % (BK / 4)) * 4;
        As[c * LPA + o] = ra[r].s0;
        As[(c + 1) * LPA + o] = ra[r].s1;
        As[(c + 2) * LPA + o] = ra[r].s2;
        As[(c + 3) * LPA + o] = ra[r].s3;
#endif
    }
}

// X' row k (tap ic, ky, kx) at 4 pixels whose windows start at (iy0, ix0): zeros in the pads.
inline float4 conv_gather4(const __global float* xn, int k, const int* iy0, const int* ix0,
                           int H, int W) {
    const int ic = k / KWIN, r = k - ic * KWIN, ky = r / KW, kx = r - ky * KW;
    const __global float* xc = xn + ic * H * W;
    float t[4];
#pragma unroll
    for (int v = 0; v < 4; ++v) {
        const int iy = iy0[v] + ky * DY, ix = ix0[v] + kx * DX;
        t[v] = (iy >= 0 && iy < H && ix >= 0 && ix < W) ? xc[iy * W + ix] : 0.0f;
    }
    return (float4)(t[0], t[1], t[2], t[3]);
}

__attribute__((reqd_work_group_size(WGX, WGY, 1)))
KERNEL(conv_lm)(OPTIONAL_SHAPE_INFO_ARG __global const float* X, __global const float* Wt,
#if HAS_BIAS
                __global const float* B,
#endif
                __global float* Y CONV_TAIL_ARGS)
{
    const int NB = T_DIM(0, 2), C = T_DIM(0, 3), H = T_DIM(0, 4), W = T_DIM(0, 5);
    const int OC = T_DIM(Y_T, 3), OH = T_DIM(Y_T, 4), OW = T_DIM(Y_T, 5), P = OH * OW, HW = H * W;
    const int pad_t = PARAM(0), pad_l = PARAM(1), OCg = PARAM(2), ICg = PARAM(3), G = PARAM(4);
    const int KK = ICg * KWIN;
    const int z = get_group_id(2), g = z % G, n = (z / G) % NB, split = z / (G * NB);
    const int KB = split * PARAM(6), KE = min(KK, KB + PARAM(6));
    const int tx = get_local_id(0), ty = get_local_id(1), tid = ty * WGX + tx;
    const int bn0 = get_group_id(0) * BN, bm0 = get_group_id(1) * BM;
    const int oc_g = g * OCg;   // the group's first output channel

    // this work-item's B quad: pixels q0..q0+3, their window origins (FLAT: the pixel itself)
    const int q0 = bn0 + (tid % BQ) * 4, kr0 = tid / BQ;
    const __global float* xn = X + T_OFF(0) + (n * C + g * ICg) * HW;
#if FLAT
    const int qlim = P - q0, xvec = ((T_OFF(0) | HW) & 3) == 0;
#else
    int iy0[4], ix0[4];
#pragma unroll
    for (int v = 0; v < 4; ++v) {
        const int p = min(q0 + v, P - 1), oy = p / OW;
        iy0[v] = q0 + v < P ? oy * SY - pad_t : -(1 << 28);   // past P: every tap out of bounds
        ix0[v] = (p - oy * OW) * SX - pad_l;
    }
#endif

#if W_BLOCKED
    // group == 1 or OCg % BM == 0 (engine/ops/conv_gemm.py): the block starts a BM-block
    const __global float* wb = Wt + T_OFF(1) + ((oc_g + bm0) / BM) * KK * BM;
#else
    const __global float* wb = Wt + T_OFF(1) + oc_g * KK;
    const int wvec = ((T_OFF(1) | KK) & 3) == 0;
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
#define LOAD_TILES(k0)                                                                         \
    _Pragma("unroll") for (int r = 0; r < LA; ++r) {                                           \
        const int e = r * NT + tid;                                                            \
        ra[r] = conv_ld_a(wb, e, (k0), KE, KK, bm0, OCg, W_VEC);                               \
    }                                                                                          \
    _Pragma("unroll") for (int r = 0; r < LB; ++r) {                                           \
        const int k = (k0) + kr0 + r * (NT / BQ);                                              \
        rb[r] = k < KE ? X_QUAD(k) : (float4)(0.0f);                                           \
    }
#if W_BLOCKED
#define W_VEC 1
#else
#define W_VEC wvec
#endif
#if FLAT
#define X_QUAD(k) ld4_lim(xn + (k) * HW + q0, qlim, xvec)
#else
#define X_QUAD(k) conv_gather4(xn, (k), iy0, ix0, H, W)
#endif

    LOAD_TILES(KB)
    for (int k0 = KB; k0 < KE; k0 += BK) {
        conv_store_a(As, ra, tid);
#pragma unroll
        for (int r = 0; r < LB; ++r)
            *(__local float4*)(Bs + (kr0 + r * (NT / BQ)) * LPB + (tid % BQ) * 4) = rb[r];
        barrier(CLK_LOCAL_MEM_FENCE);
        if (k0 + BK < KE) {
            LOAD_TILES(k0 + BK)
        }
        TILE_PRODUCTS(As4, Bs4)
        barrier(CLK_LOCAL_MEM_FENCE);
    }
#undef LOAD_TILES
#undef X_QUAD
#undef W_VEC

    // outputs: channel rows (i / 4 * WGY + ty) * 4 + i % 4, pixel quads (j * WGX + tx) * 4
    // (128-bit stores when Y's offset and P are multiples of 4)
    const int yvec = ((T_OFF(Y_T) | P) & 3) == 0;
#pragma unroll
    for (int j = 0; j < RN / 4; ++j) {
        const int p0 = bn0 + (j * WGX + tx) * 4;
        if (p0 >= P) continue;
#if !CONV_SPLIT
        int oy[4], ox[4];
#pragma unroll
        for (int v = 0; v < 4; ++v) {
            oy[v] = (p0 + v) / OW;
            ox[v] = p0 + v - oy[v] * OW;
        }
#endif
#pragma unroll
        for (int i = 0; i < RM; ++i) {
            const int ocl = bm0 + ((i / 4) * WGY + ty) * 4 + i % 4;
            if (ocl >= OCg) continue;
            const int oc = oc_g + ocl;
            float vals[4] = {acc[i][j].s0, acc[i][j].s1, acc[i][j].s2, acc[i][j].s3};
#if CONV_SPLIT
            __global float* t = T + T_OFF(T_T) + ((split * NB + n) * OC + oc) * P + p0;
#pragma unroll
            for (int v = 0; v < 4; ++v)
                if (p0 + v < P) t[v] = vals[v];
#else
            const int o = (n * OC + oc) * P + p0;
#pragma unroll
            for (int v = 0; v < 4; ++v) {
#if HAS_BIAS
                vals[v] += B[T_OFF(2) + oc];
#endif
#if HAS_FUSED_OPS
                if (p0 + v < P) vals[v] = FUSED_OPS_AT(vals[v], o + v, OUT_COORDS(n, oc, oy[v], ox[v]));
#endif
            }
            __global float* yp = Y + T_OFF(Y_T) + o;
            if (yvec && p0 + 4 <= P) {
                *(__global float4*)yp = (float4)(vals[0], vals[1], vals[2], vals[3]);
            } else {
#pragma unroll
                for (int v = 0; v < 4; ++v)
                    if (p0 + v < P) yp[v] = vals[v];
            }
#endif
        }
    }
}
#endif

// CONV_SPLIT's second kernel: Y = the S partial sums (+ bias) through the fused ops. Work: one
// work-item per output element.
KERNEL(conv_split_reduce)(OPTIONAL_SHAPE_INFO_ARG __global const float* X, __global const float* Wt,
#if HAS_BIAS
                          __global const float* B,
#endif
                          __global float* Y, __global const float* T FUSED_ARGS)
{
    const int OC = T_DIM(Y_T, 3), OH = T_DIM(Y_T, 4), OW = T_DIM(Y_T, 5), P = OH * OW;
    const int total = T_DIM(Y_T, 2) * OC * P, S = PARAM(5);
    const int o = get_global_id(0);
    if (o >= total) return;
    const __global float* t = T + T_OFF(T_T) + o;
    float a0 = 0.0f, a1 = 0.0f;   // 2 sums: 2 loads in flight per step
    int s = 0;
    for (; s + 2 <= S; s += 2) {
        a0 += t[s * total];
        a1 += t[(s + 1) * total];
    }
    if (s < S) a0 += t[s * total];
    float y = a0 + a1;
    const int nc = o / P, n = nc / OC, oc = nc - n * OC, p = o - nc * P, oy = p / OW;
#if HAS_BIAS
    y += B[T_OFF(2) + oc];
#endif
#if HAS_FUSED_OPS
    y = FUSED_OPS_AT(y, o, OUT_COORDS(n, oc, oy, p - oy * OW));
#endif
    Y[T_OFF(Y_T) + o] = y;
}
