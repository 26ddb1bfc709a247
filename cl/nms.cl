// NonMaxSuppression (engine/ops/nms.py), split as NonZero is: nms_select picks each (batch,
// class)'s boxes, gather_nms writes the [count, 3] (batch, class, box) rows once the host has
// read the counts (B * C longs) for the output's shape.

// ---- nms_select: a work-item per (batch, class) ------------------------------------------------
// Greedy, as onnx.reference and onnxruntime: candidates (score > score_threshold when given) in
// order of score, ties by lower index; one is kept unless its IoU with a kept box exceeds
// iou_threshold; at most max_output_boxes_per_class kept. The next candidate is the best key
// after the previous one, found by a scan: O(S^2) per class, no sort and no scratch.
// JIT: HAS_MAX, HAS_IOU, HAS_SCORE (optional inputs given), CENTER (center_point_box), and the
// argument positions T_MAX, T_IOU, T_SCORE, T_SEL, T_CNT. Tensors: 0 boxes [B, S, 4], 1 scores
// [B, C, S], the optional inputs, SEL [B * C, S] int (kept box indices, in order), CNT [B * C]
// long. PARAM(0) S, PARAM(1) C, PARAM(2) B * C.
#ifdef NMS_SELECT
inline int nms_suppress(const __global float* p, const __global float* q, float iou_th)
{
    float ax0, ax1, ay0, ay1, bx0, bx1, by0, by1;
#if CENTER
    ax0 = p[0] - p[2] / 2; ax1 = p[0] + p[2] / 2; ay0 = p[1] - p[3] / 2; ay1 = p[1] + p[3] / 2;
    bx0 = q[0] - q[2] / 2; bx1 = q[0] + q[2] / 2; by0 = q[1] - q[3] / 2; by1 = q[1] + q[3] / 2;
#else   // [y1, x1, y2, x2], either corner first
    ax0 = fmin(p[1], p[3]); ax1 = fmax(p[1], p[3]); ay0 = fmin(p[0], p[2]); ay1 = fmax(p[0], p[2]);
    bx0 = fmin(q[1], q[3]); bx1 = fmax(q[1], q[3]); by0 = fmin(q[0], q[2]); by1 = fmax(q[0], q[2]);
#endif
    const float ix = fmin(ax1, bx1) - fmax(ax0, bx0), iy = fmin(ay1, by1) - fmax(ay0, by0);
    if (ix <= 0 || iy <= 0) return 0;
    const float inter = ix * iy;
    const float a1 = (ax1 - ax0) * (ay1 - ay0), a2 = (bx1 - bx0) * (by1 - by0);
    const float uni = a1 + a2 - inter;
    if (inter <= 0 || a1 <= 0 || a2 <= 0 || uni <= 0) return 0;
    return inter / uni > iou_th;
}

KERNEL(nms_select)(OPTIONAL_SHAPE_INFO_ARG __global const float* boxes, __global const float* scores
#if HAS_MAX
                   , __global const long* max_out
#endif
#if HAS_IOU
                   , __global const float* iou
#endif
#if HAS_SCORE
                   , __global const float* score_th
#endif
                   , __global int* sel, __global long* cnt)
{
    const int gid = get_global_id(0);
    const int S = PARAM(0), C = PARAM(1);
    if (gid >= PARAM(2)) return;
    const int b = gid / C;
    const __global float* bx = boxes + T_OFF(0) + b * S * 4;
    const __global float* sc = scores + T_OFF(1) + gid * S;
    __global int* kept = sel + T_OFF(T_SEL) + gid * S;
#if HAS_MAX
    const long limit = min(max(max_out[T_OFF(T_MAX)], 0L), (long)S);
#else
    const long limit = 0;
#endif
#if HAS_IOU
    const float iou_th = iou[T_OFF(T_IOU)];
#else
    const float iou_th = 0.0f;
#endif
    int n = 0, last = -1;
    float last_s = INFINITY;
    for (int step = 0; step < S && n < limit; ++step) {
        int best = -1;
        float bs = 0.0f;
        for (int i = 0; i < S; ++i) {
            const float s = sc[i];
#if HAS_SCORE
            if (!(s > score_th[T_OFF(T_SCORE)])) continue;
#endif
            if (!(s < last_s || (s == last_s && i > last))) continue;   // taken already
            if (best < 0 || s > bs) { best = i; bs = s; }
        }
        if (best < 0) break;
        last = best;
        last_s = bs;
        int keep = 1;
        for (int j = 0; j < n && keep; ++j)
            keep = !nms_suppress(bx + best * 4, bx + kept[j] * 4, iou_th);
        if (keep) kept[n++] = best;
    }
    cnt[T_OFF(T_CNT) + gid] = n;
}
#endif

// ---- gather_nms: a work-item per (batch, class), its rows after those of the ones before -----
// Tensors: 0 SEL, 1 CNT, 2 Y [count, 3] long. PARAM(0) S, PARAM(1) C, PARAM(2) B * C.
#ifdef GATHER_NMS
KERNEL(gather_nms)(OPTIONAL_SHAPE_INFO_ARG __global const int* sel, __global const long* cnt,
                   __global long* Y)
{
    const int gid = get_global_id(0);
    const int S = PARAM(0), C = PARAM(1);
    if (gid >= PARAM(2)) return;
    const __global long* c = cnt + T_OFF(1);
    long row = 0;
    for (int k = 0; k < gid; ++k) row += c[k];
    __global long* y = Y + T_OFF(2) + row * 3;
    for (int j = 0; j < c[gid]; ++j) {
        y[j * 3] = gid / C;
        y[j * 3 + 1] = gid % C;
        y[j * 3 + 2] = sel[T_OFF(0) + gid * S + j];
    }
}
#endif
