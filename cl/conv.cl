// 2-D convolution, NCHW, direct (no im2col), register-blocked.
// Tensors: 0 X [N, C, H, W], 1 W [OC, C/group, KH, KW], [2 B [OC]], then Y [N, OC, OH, OW].
// JIT: OCB (output channels per work-item), PW (output pixels per work-item along x: 1, 2, 4,
//      8 or 16), SX, SY (strides), DX, DY (dilations), HAS_BIAS.
// PARAM(0) pad top, PARAM(1) pad left, PARAM(2) output channels per group,
// PARAM(3) OCB-blocks per group, PARAM(4) PW-blocks per output row.
// Work: gws = (OH * x-blocks, group * blocks per group, N); every work-item computes OCB output
// channels of one group for PW consecutive output pixels of one row. Pointwise convs (1x1,
// stride 1, no pads) are given X and Y viewed as one row of H*W pixels (engine/ops/conv.py).
#if HAS_BIAS
#define Y_T 3
#else
#define Y_T 2
#endif

#if PW == 1
#define VT float
#define VLOAD(p) (*(p))
#define VSTORE(v, p) (*(p) = (v))
#else
#define VT CAT(float, PW)
#define VLOAD(p) CAT(vload, PW)(0, p)
#define VSTORE(v, p) CAT(vstore, PW)(v, 0, p)
#endif

// lane accessors for the gather / masked paths
inline void set_lane(VT* v, int l, float x) { ((float*)v)[l] = x; }
inline float get_lane(VT v, int l) { return ((float*)&v)[l]; }

KERNEL(conv2d)(OPTIONAL_SHAPE_INFO_ARG __global const float* X, __global const float* Wt,
#if HAS_BIAS
               __global const float* B,
#endif
               __global float* Y FUSED_ARGS)
{
    const int C = T_DIM(0, 3), H = T_DIM(0, 4), W = T_DIM(0, 5);
    const int ICg = T_DIM(1, 3), KH = T_DIM(1, 4), KW = T_DIM(1, 5);
    const int OC = T_DIM(Y_T, 3), OH = T_DIM(Y_T, 4), OW = T_DIM(Y_T, 5);
    const int pad_t = PARAM(0), pad_l = PARAM(1), OCg = PARAM(2), BPG = PARAM(3), XB = PARAM(4);

    const int gid0 = get_global_id(0), gid1 = get_global_id(1), n = get_global_id(2);
    const int oy = gid0 / XB;
    const int ox0 = (gid0 - oy * XB) * PW;
    if (oy >= OH) return;
    const int g = gid1 / BPG;
    const int oc0 = g * OCg + (gid1 - g * BPG) * OCB;
    const int oc_end = (g + 1) * OCg;
    const int KK = ICg * KH * KW;

    // weights of this work-item's channels (clamped: tail channels compute garbage, not stored)
    const __global float* wp = Wt + T_OFF(1) + min(oc0, oc_end - 1) * KK;
    int wstep[OCB];
#pragma unroll
    for (int j = 0; j < OCB; ++j) wstep[j] = (min(oc0 + j, oc_end - 1) - min(oc0, oc_end - 1)) * KK;

    VT acc[OCB];
#pragma unroll
    for (int j = 0; j < OCB; ++j) {
#if HAS_BIAS
        acc[j] = (VT)(B[T_OFF(2) + min(oc0 + j, oc_end - 1)]);
#else
        acc[j] = (VT)(0.0f);
#endif
    }

    const int ixs = ox0 * SX - pad_l;
    // every lane of every tap in bounds along x (and every lane a real output pixel)
    const bool x_in = ixs >= 0 && ixs + (PW - 1) * SX + (KW - 1) * DX < W && ox0 + PW <= OW;
    const int iy0 = oy * SY - pad_t;
    const int ky_lo = iy0 >= 0 ? 0 : (-iy0 + DY - 1) / DY;
    const int ky_hi = min(KH, (H - iy0 + DY - 1) / DY);   // exclusive
    const __global float* xn = X + T_OFF(0) + (n * C + g * ICg) * H * W;

    for (int ic = 0; ic < ICg; ++ic) {
        const __global float* xc = xn + ic * H * W;
        const __global float* wc = wp + ic * KH * KW;
        for (int ky = ky_lo; ky < ky_hi; ++ky) {
            const __global float* xr = xc + (iy0 + ky * DY) * W + ixs;
            const __global float* wr = wc + ky * KW;
            if (x_in) {
                for (int kx = 0; kx < KW; ++kx) {
                    const __global float* p = xr + kx * DX;
                    VT xv;
#if SX == 1
                    xv = VLOAD(p);
#else
#pragma unroll
                    for (int l = 0; l < PW; ++l) set_lane(&xv, l, p[l * SX]);
#endif
#pragma unroll
                    for (int j = 0; j < OCB; ++j) acc[j] = VMAD(PW, (VT)(wr[wstep[j] + kx]), xv, acc[j]);
                }
            } else {
                for (int kx = 0; kx < KW; ++kx) {
                    const int ix = ixs + kx * DX;
                    VT xv;
#pragma unroll
                    for (int l = 0; l < PW; ++l) {
                        const int i = ix + l * SX;
                        set_lane(&xv, l, (i >= 0 && i < W) ? xr[kx * DX + l * SX] : 0.0f);
                    }
#pragma unroll
                    for (int j = 0; j < OCB; ++j) acc[j] = VMAD(PW, (VT)(wr[wstep[j] + kx]), xv, acc[j]);
                }
            }
        }
    }

    __global float* yp = Y + T_OFF(Y_T) + ((n * OC + oc0) * OH + oy) * OW + ox0;
    const int nvalid = min(PW, OW - ox0);
#pragma unroll
    for (int j = 0; j < OCB; ++j) {
        if (oc0 + j < oc_end) {
#if HAS_FUSED_OPS
            const int o = (yp - Y - T_OFF(Y_T)) + j * OH * OW;
            // FUSED_COORDS (not in the pointwise one-row view): operand offsets from coordinates
            for (int l = 0; l < nvalid; ++l)
                set_lane(&acc[j], l, FUSED_OPS_AT(get_lane(acc[j], l), o + l, OUT_COORDS(n, oc0 + j, oy, ox0 + l)));
#endif
            if (nvalid == PW) {
                VSTORE(acc[j], yp + j * OH * OW);
            } else {
                for (int l = 0; l < nvalid; ++l) yp[j * OH * OW + l] = get_lane(acc[j], l);
            }
        }
    }
}
