// 2-D convolution, NCHW, as a register-tiled implicit GEMM: per image and group,
// Y[oc, p] = sum_k W[oc, k] * X'[k, p] with k = (ic, ky, kx) and p an output pixel. Every
// work-item computes TM output channels x TP output pixels (TM float-TP accumulators) and
// needs no barrier (PoCL serialises work-groups with barriers badly); on GPUs the weights are
// uniform across a warp (pixels run along dim 0) and the pixel loads coalesce.
// Tensors: 0 X [N, C, H, W], 1 W ([OC, C/group, KH, KW], or with W_BLOCKED the reordered
// [ceil(OC/TM), ICg*KH*KW, TM], zero-filled past OC: one contiguous TM-vector per k),
// [2 B [OC]], then Y [N, OC, OH, OW].
// JIT: TM, TP (4, 8 or 16), SY, SX, DY, DX, HAS_BIAS, W_BLOCKED, ROWS (1: a work-item's pixels
//      lie in one output row, any window; 0: pixels over the flattened image, 1x1 windows with
//      stride 1 and no pads only, so every tap is in bounds).
// PARAM(0) pad top, (1) pad left, (2) output channels per group, (3) TM-blocks per group,
// (4) TP-blocks per output row (ROWS) or per image, (5) ICg, (6) KH, (7) KW.
// Work: gws = (OH * blocks per row or blocks per image, group * blocks per group, N).
#define Y_T (2 + HAS_BIAS)   // Y's tensor argument
#define VT CAT(float, TP)
#define VLOAD(p) CAT(vload, TP)(0, p)
#define VSTORE(v, p) CAT(vstore, TP)(v, 0, p)

// M(i) for every lane i of a TP-vector (hex digits: the .sN component names)
#define LANES4(M) M(0) M(1) M(2) M(3)
#define LANES8(M) LANES4(M) M(4) M(5) M(6) M(7)
#define LANES16(M) LANES8(M) M(8) M(9) M(a) M(b) M(c) M(d) M(e) M(f)
#define LANES(M) CAT(LANES, TP)(M)

// XLOAD(v, p): v = p[0], p[SX], ... p[(TP - 1) * SX], reading XSPAN floats from p (XGATHER:
// lane by lane)
#if SX == 1
#define XSPAN TP
#define XLOAD(v, p) v = VLOAD(p)
#elif SX == 2 && TP == 4
#define XSPAN 8
#define XLOAD(v, p) v = vload8(0, p).even
#elif SX == 2 && TP == 8
#define XSPAN 16
#define XLOAD(v, p) v = vload16(0, p).even
#else
#define XSPAN ((TP - 1) * SX + 1)
#define XGATHER 1
#endif

KERNEL(conv_tiled)(OPTIONAL_SHAPE_INFO_ARG __global const float* X, __global const float* Wt,
#if HAS_BIAS
                   __global const float* B,
#endif
                   __global float* Y FUSED_ARGS)
{
    const int C = T_DIM(0, 3), H = T_DIM(0, 4), W = T_DIM(0, 5);
    const int OC = T_DIM(Y_T, 3), OH = T_DIM(Y_T, 4), OW = T_DIM(Y_T, 5);
    const int pad_t = PARAM(0), pad_l = PARAM(1), OCg = PARAM(2), BPG = PARAM(3), XB = PARAM(4);
    const int ICg = PARAM(5), KH = PARAM(6), KW = PARAM(7);
    const int KK = ICg * KH * KW, HW = H * W;

    const int gid0 = get_global_id(0), gid1 = get_global_id(1), n = get_global_id(2);
    const int g = gid1 / BPG;
    const int oc0 = g * OCg + (gid1 - g * BPG) * TM;
    const int oc_end = g * OCg + OCg;
    if (oc0 >= oc_end || g * OCg >= OC || n >= T_DIM(0, 2)) return;   // work sizes rounded up to the work-group
#if ROWS
    const int oy = gid0 / XB;
    const int ox0 = (gid0 - oy * XB) * TP;
    if (oy >= OH) return;
    const int nvalid = min(TP, OW - ox0);
#else
    const int P = OH * OW;
    const int p0 = gid0 * TP;
    if (p0 >= P) return;
    const int nvalid = min(TP, P - p0);
#endif

#if W_BLOCKED
    // group == 1 or OCg % TM == 0 (engine/ops/conv.py): oc0 starts a block
    const __global float* wb = Wt + T_OFF(1) + (oc0 / TM) * KK * TM;
#define WGT(k, j) wb[(k) * TM + (j)]
#else
    // rows of this work-item's channels, clamped: tail channels compute garbage, never stored
    const __global float* wb = Wt + T_OFF(1);
    int wrow[TM];
#pragma unroll
    for (int j = 0; j < TM; ++j) wrow[j] = min(oc0 + j, oc_end - 1) * KK;
#define WGT(k, j) wb[wrow[j] + (k)]
#endif

    VT acc[TM];
#pragma unroll
    for (int j = 0; j < TM; ++j) {
#if HAS_BIAS
        acc[j] = (VT)(B[T_OFF(2) + min(oc0 + j, oc_end - 1)]);
#else
        acc[j] = (VT)(0.0f);
#endif
    }
    const __global float* xn = X + T_OFF(0) + (n * C + g * ICg) * HW;
    const int x_end = (T_DIM(0, 2) * C - n * C - g * ICg) * HW;   // X's end, from xn

#if !ROWS
    // 1x1, stride 1, no pads: tap k = ic reads pixel p's input at ic * HW + p; a tail block's
    // lanes past the image read on into the next channel (never stored), not past X's end
    if ((ICg - 1) * HW + p0 + TP <= x_end) {
        const __global float* xp = xn + p0;
        for (int ic = 0; ic < ICg; ++ic) {
            const VT xv = VLOAD(xp + ic * HW);
#pragma unroll
            for (int j = 0; j < TM; ++j) acc[j] = VMAD(TP, (VT)(WGT(ic, j)), xv, acc[j]);
        }
    } else {
        for (int ic = 0; ic < ICg; ++ic) {
            const __global float* xp = xn + ic * HW + p0;
            VT xv;
#define GATHER(i) xv.s##i = xp[min(0x##i, nvalid - 1)];
            LANES(GATHER)
#undef GATHER
#pragma unroll
            for (int j = 0; j < TM; ++j) acc[j] = VMAD(TP, (VT)(WGT(ic, j)), xv, acc[j]);
        }
    }
#else
    const int ixs = ox0 * SX - pad_l;
    const int iy0 = oy * SY - pad_t;
    const int ky_lo = iy0 >= 0 ? 0 : (-iy0 + DY - 1) / DY;
    const int ky_hi = min(KH, (H - iy0 + DY - 1) / DY);   // exclusive
    for (int ic = 0; ic < ICg; ++ic) {
        for (int ky = ky_lo; ky < ky_hi; ++ky) {
            const int r = ic * HW + (iy0 + ky * DY) * W;   // this input row, from xn
            const int k0 = (ic * KH + ky) * KW;
            for (int kx = 0; kx < KW; ++kx) {
                const int lo = ixs + kx * DX;
                const __global float* xp = xn + r + lo;
                VT xv;
                // vector load when the real lanes' taps lie inside the row; lanes past OW may
                // read on into the next rows (never stored), not past the end of X
                if (lo >= 0 && lo + (nvalid - 1) * SX < W && r + lo + XSPAN <= x_end) {
#if XGATHER
#define GATHER(i) xv.s##i = xp[0x##i * SX];
                    LANES(GATHER)
#undef GATHER
#else
                    XLOAD(xv, xp);
#endif
                } else {
#define GATHER(i) xv.s##i = (lo + 0x##i * SX >= 0 && lo + 0x##i * SX < W) ? xp[0x##i * SX] : 0.0f;
                    LANES(GATHER)
#undef GATHER
                }
#pragma unroll
                for (int j = 0; j < TM; ++j) acc[j] = VMAD(TP, (VT)(WGT(k0 + kx, j)), xv, acc[j]);
            }
        }
    }
#endif

#if ROWS
    const int o0 = ((n * OC + oc0) * OH + oy) * OW + ox0;
#else
    const int o0 = (n * OC + oc0) * P + p0;
#endif
    const int ostep = OH * OW;
#if HAS_FUSED_OPS && !ROWS
    int py[TP], px[TP];   // each lane's output row and column
#pragma unroll
    for (int l = 0; l < TP; ++l) {
        py[l] = (p0 + l) / OW;
        px[l] = p0 + l - py[l] * OW;
    }
#endif
    __global float* yp = Y + T_OFF(Y_T) + o0;
#pragma unroll
    for (int j = 0; j < TM; ++j) {
        if (oc0 + j < oc_end) {
            VT v = acc[j];
#if HAS_FUSED_OPS
            // operand offsets from the coordinates (FUSED_COORDS): no division per element
            const int o = o0 + j * ostep, oc = oc0 + j;
#if ROWS
#define EPI(i) if (0x##i < nvalid) \
                v.s##i = FUSED_OPS_AT(v.s##i, o + 0x##i, OUT_COORDS(n, oc, oy, ox0 + 0x##i));
#else
#define EPI(i) if (0x##i < nvalid) \
                v.s##i = FUSED_OPS_AT(v.s##i, o + 0x##i, OUT_COORDS(n, oc, py[0x##i], px[0x##i]));
#endif
            LANES(EPI)
#undef EPI
#endif
            if (nvalid == TP) {
                VSTORE(v, yp + j * ostep);
            } else {
#define STORE(i) if (0x##i < nvalid) yp[j * ostep + 0x##i] = v.s##i;
                LANES(STORE)
#undef STORE
            }
        }
    }
}
