// Quantization (engine/ops/quant.py): QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear,
// and the integer MatMul/Conv kernels of MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv.
// Arithmetic follows onnxruntime's CPU kernels: quantize as rint(x / scale) + zero point,
// saturated (rint: round half to even); dequantize as float(x - zero point) * scale; integer
// products accumulated exactly in int; requantize as rint(float(acc) * multiplier) + zero
// point, saturated, the multiplier (a_scale * b_scale) / y_scale computed in float.

// x / s, correctly rounded: OpenCL lets float division be off by 2.5 ulp, and a tie of
// rint() moves with the last bit. A double quotient rounded to float is the correctly rounded
// float quotient (53 >= 2 * 24 + 2 bits).
inline float q_div(float x, float s) {
#ifdef cl_khr_fp64
    return (float)((double)x / (double)s);
#else
    return x / s;
#endif
}

#ifndef QMIN
#define QMIN 0
#define QMAX 255
#endif

// rint(v) + zp saturated to [QMIN, QMAX]: clamped as float first (v may be far out of int range)
inline int q_sat(float v, float zp) {
    return (int)clamp(rint(v) + zp, (float)QMIN, (float)QMAX);
}

#ifdef Q_MODE
// The scale (and zero point) element of data element g: Q_MODE 0 one for the tensor, 1 one
// per index along the axis (1-D scale), 2 blocks of PARAM(2) along the axis (scale of the
// data's rank, PARAM(3) along the axis). PARAM(0) the axis dim, PARAM(1) the elements after it.
inline int q_param_index(SHAPE_INFO_PTR si, int g) {
#if Q_MODE == 0
    return 0;
#else
    const int A = si[NUM_TENSORS * TBLOCK], inner = si[NUM_TENSORS * TBLOCK + 1];
    const int a = (g / inner) % A;
#if Q_MODE == 1
    return a;
#else
    const int block = si[NUM_TENSORS * TBLOCK + 2], SA = si[NUM_TENSORS * TBLOCK + 3];
    return ((g / inner / A) * SA + a / block) * inner + g % inner;
#endif
#endif
}

#if HAS_ZP
#define ZP_ARG , __global const TZ* zp
#define ZP_AT(k) ((float)zp[T_OFF(2) + (k)])
#define Q_OUT 3
#else
#define ZP_ARG
#define ZP_AT(k) 0.0f
#define Q_OUT 2
#endif

// tensors: 0 x (TX), 1 scale (float), [2 zero point (TZ)], then y (TY)
KERNEL(quantize)(OPTIONAL_SHAPE_INFO_ARG __global const TX* x, __global const float* scale ZP_ARG,
                 __global TY* y)
{
    const int g = get_global_id(0);
    if (g >= T_COUNT(0)) return;
    const int k = q_param_index(shape_info, g);
    const float v = q_div((float)LOAD_TX(x, T_OFF(0) + g), scale[T_OFF(1) + k]);
    y[T_OFF(Q_OUT) + g] = (TY)q_sat(v, ZP_AT(k));
}

// tensors: 0 x (TX), 1 scale (float), [2 zero point (TX)], then y (float)
KERNEL(dequantize)(OPTIONAL_SHAPE_INFO_ARG __global const TX* x, __global const float* scale ZP_ARG,
                   __global float* y)
{
    const int g = get_global_id(0);
    if (g >= T_COUNT(0)) return;
    const int k = q_param_index(shape_info, g);
#if HAS_ZP
    const int d = (int)x[T_OFF(0) + g] - (int)zp[T_OFF(2) + k];
#else
    const int d = (int)x[T_OFF(0) + g];
#endif
    y[T_OFF(Q_OUT) + g] = (float)d * scale[T_OFF(1) + k];
}
#endif

#ifdef DQL_WG
// DynamicQuantizeLinear's parameters, one work-group of DQL_WG items: the range of x widened
// to hold 0, scale = (max - min) / (QMAX - QMIN) (1 when the range is empty, as onnxruntime),
// zero point = rint(clamp(QMIN - min / scale)). tensors: 0 x, 1 scale [], 2 zero point [] (TY)
KERNEL(dql_params)(OPTIONAL_SHAPE_INFO_ARG __global const float* x, __global float* scale,
                   __global TY* zp)
{
    __local float lo[DQL_WG], hi[DQL_WG];
    const int lid = get_local_id(0), n = T_COUNT(0);
    float mn = 0.0f, mx = 0.0f;
    for (int i = lid; i < n; i += DQL_WG) {
        const float v = x[T_OFF(0) + i];
        mn = fmin(mn, v);
        mx = fmax(mx, v);
    }
    lo[lid] = mn;
    hi[lid] = mx;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = DQL_WG / 2; s > 0; s >>= 1) {
        if (lid < s) {
            lo[lid] = fmin(lo[lid], lo[lid + s]);
            hi[lid] = fmax(hi[lid], hi[lid + s]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0) {
        const float s = hi[0] == lo[0] ? 1.0f : q_div(hi[0] - lo[0], (float)(QMAX - QMIN));
        scale[T_OFF(1)] = s;
        zp[T_OFF(2)] = (TY)rint(clamp((float)QMIN - q_div(lo[0], s), (float)QMIN, (float)QMAX));
    }
}
#endif

#if defined(INT_MM) || defined(INT_CONV)
// The integer kernels' tensors after the two data operands P (A or X, type TA) and Q (B or W,
// type TB): [P's zero point (TA): scalar, or one per row of A], [Q's zero point (TB): scalar,
// or one per column of B / output channel] (HAS_PZ, HAS_QZ: absent means 0); then
//  INT_KIND 1 (MatMulInteger, ConvInteger): Y int;
//  INT_KIND 2 (QLinearMatMul, QLinearConv): P's scale [], Q's scale [1 or per column/channel],
//  Y's scale [], Y's zero point [] (TY), [bias [OC] int (HAS_BIAS, QLinearConv)], Y (TY).
#define T_PZ 2
#define T_QZ (T_PZ + HAS_PZ)
#define T_PS (T_QZ + HAS_QZ)
#if INT_KIND == 2
#define T_QS (T_PS + 1)
#define T_YS (T_PS + 2)
#define T_YZ (T_PS + 3)
#define T_BIAS (T_PS + 4)
#define T_Y (T_BIAS + HAS_BIAS)
#define INT_Y_ARGS __global const float* p_s, __global const float* q_s, __global const float* y_s, \
    __global const TY* y_zp, INT_BIAS_ARG __global TY* Y
#if HAS_BIAS
#define INT_BIAS_ARG __global const int* bias,
#else
#define INT_BIAS_ARG
#endif
#else
#define T_Y T_PS
#define INT_Y_ARGS __global int* Y
#endif
#if HAS_PZ
#define PZ_ARG __global const TA* p_zp,
#define P_ZP(i) ((int)p_zp[T_OFF(T_PZ) + (T_COUNT(T_PZ) > 1 ? (i) : 0)])
#else
#define PZ_ARG
#define P_ZP(i) 0
#endif
#if HAS_QZ
#define QZ_ARG __global const TB* q_zp,
#define Q_ZP(i) ((int)q_zp[T_OFF(T_QZ) + (T_COUNT(T_QZ) > 1 ? (i) : 0)])
#else
#define QZ_ARG
#define Q_ZP(i) 0
#endif

// Y's value of accumulator acc at column / channel j
#if INT_KIND == 2
#define INT_STORE(i, acc, j) \
    Y[i] = (TY)q_sat((float)(acc) * q_div(p_s[T_OFF(T_PS)] * \
        q_s[T_OFF(T_QS) + (T_COUNT(T_QS) > 1 ? (j) : 0)], y_s[T_OFF(T_YS)]), (float)y_zp[T_OFF(T_YZ)])
#else
#define INT_STORE(i, acc, j) Y[i] = (acc)
#endif
#endif

#ifdef INT_MM
// Integer matmul with numpy batch broadcasting: acc = sum_k (A - a_zp) * (B - b_zp); A
// [.., M, K], B [.., K, N], Y [.., M, N]. PARAM(0) M, PARAM(1) N, PARAM(2) K.
// Work: (N, M, batch), one output each.
KERNEL(matmul_integer)(OPTIONAL_SHAPE_INFO_ARG __global const TA* A, __global const TB* B,
                       PZ_ARG QZ_ARG INT_Y_ARGS)
{
    const int M = PARAM(0), N = PARAM(1), K = PARAM(2);
    const int n = get_global_id(0), m = get_global_id(1), bat = get_global_id(2);
    if (n >= N || m >= M) return;
    int a_off = T_OFF(0), b_off = T_OFF(1), y_off = T_OFF(T_Y);
    {   // batch offsets, A and B broadcast where their batch dim is 1
        int rem = bat, sa = M * K, sb = K * N, sy = M * N;
        for (int d = MAX_RANK - 3; d >= 0; --d) {
            const int nd = T_DIM(T_Y, d), i = rem % nd;
            rem /= nd;
            if (T_DIM(0, d) != 1) a_off += i * sa;
            if (T_DIM(1, d) != 1) b_off += i * sb;
            y_off += i * sy;
            sa *= T_DIM(0, d);
            sb *= T_DIM(1, d);
            sy *= nd;
        }
    }
    const int za = P_ZP(m), zb = Q_ZP(n);
    const __global TA* a = A + a_off + m * K;
    const __global TB* b = B + b_off + n;
    int acc = 0;
    for (int k = 0; k < K; ++k)
        acc += ((int)a[k] - za) * ((int)b[k * N] - zb);
    INT_STORE(y_off + m * N + n, acc, n);
}
#endif

#ifdef INT_CONV
// Integer 2-D convolution, NCHW (1-D as 2-D with a unit height), direct: X [N, C, H, W],
// W [OC, C/group, KH, KW], Y [N, OC, OH, OW]. JIT: SY, SX strides, DY, DX dilations.
// PARAM(0) pad top, PARAM(1) pad left, PARAM(2) groups. Work: (OW, OH, N * OC), one output each.
KERNEL(conv_integer)(OPTIONAL_SHAPE_INFO_ARG __global const TA* X, __global const TB* Wt,
                     PZ_ARG QZ_ARG INT_Y_ARGS)
{
    const int C = T_DIM(0, 3), H = T_DIM(0, 4), W = T_DIM(0, 5);
    const int ICg = T_DIM(1, 3), KH = T_DIM(1, 4), KW = T_DIM(1, 5);
    const int OC = T_DIM(T_Y, 3), OH = T_DIM(T_Y, 4), OW = T_DIM(T_Y, 5);
    const int ox = get_global_id(0), oy = get_global_id(1), noc = get_global_id(2);
    if (ox >= OW || oy >= OH) return;
    const int n = noc / OC, oc = noc % OC, g = oc / (OC / PARAM(2));
    const int zx = P_ZP(0), zw = Q_ZP(oc);
    const __global TA* xg = X + T_OFF(0) + (n * C + g * ICg) * H * W;
    const __global TB* wo = Wt + T_OFF(1) + oc * ICg * KH * KW;
    const int iy0 = oy * SY - PARAM(0), ix0 = ox * SX - PARAM(1);
    int acc = 0;
    for (int ic = 0; ic < ICg; ++ic)
        for (int ky = 0; ky < KH; ++ky) {
            const int iy = iy0 + ky * DY;
            if (iy < 0 || iy >= H) continue;   // padding holds the zero point: adds 0
            for (int kx = 0; kx < KW; ++kx) {
                const int ix = ix0 + kx * DX;
                if (ix < 0 || ix >= W) continue;
                acc += ((int)xg[(ic * H + iy) * W + ix] - zx) *
                       ((int)wo[(ic * KH + ky) * KW + kx] - zw);
            }
        }
#if INT_KIND == 2 && HAS_BIAS
    acc += bias[T_OFF(T_BIAS) + oc];
#endif
    INT_STORE(T_OFF(T_Y) + ((n * OC + oc) * OH + oy) * OW + ox, acc, oc);
}
#endif
