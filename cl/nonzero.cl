// NonZero as two primitives (engine/ops/nonzero.py). JIT: T element type, WG work-group size.
//
// Each kernel runs as ONE work-group of WG items; item i owns the i-th contiguous chunk of the
// input (row-major). count_nonzero sums the chunks' counts; gather_nonzero counts its chunk,
// takes the exclusive prefix of the chunk counts over the group (the chunk's first output
// column) and then writes its chunk's indices in order: O(n) work, row-major order for free.
// A multi-group version would need a per-chunk count buffer between two kernels (an internal
// buffer); the single group keeps the primitive to one kernel and no scratch memory.

#ifndef NZ
#define NZ(v) ((v) != (T)0)
#endif

// [begin, end) of item `lid`'s chunk of n elements
inline int chunk_begin(int lid, int n) { return min(lid * ((n + WG - 1) / WG), n); }

inline int count_chunk(__global const T* in, int b, int e) {
    int c = 0;
    for (int i = b; i < e; ++i)
        c += NZ(in[i]) ? 1 : 0;
    return c;
}

// args: input, count (one long)
KERNEL(count_nonzero)(OPTIONAL_SHAPE_INFO_ARG __global const T* in, __global long* count)
{
    __local int part[WG];
    const int lid = get_local_id(0);
    const int n = T_COUNT(0);
    part[lid] = count_chunk(in + T_OFF(0), chunk_begin(lid, n), chunk_begin(lid + 1, n));
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = WG / 2; s > 0; s >>= 1) {
        if (lid < s)
            part[lid] += part[lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0)
        count[T_OFF(1)] = (long)part[0];
}

// args: input, indices [rows, count] (rows = max(rank, 1)). PARAM(0): rows.
KERNEL(gather_nonzero)(OPTIONAL_SHAPE_INFO_ARG __global const T* in, __global long* out)
{
    __local int first[WG];
    const int lid = get_local_id(0);
    const int n = T_COUNT(0);
    const int rows = PARAM(0);
    const int count = T_DIM(1, MAX_RANK - 1);
    const int b = chunk_begin(lid, n), e = chunk_begin(lid + 1, n);
    __global const T* src = in + T_OFF(0);
    __global long* dst = out + T_OFF(1);
    first[lid] = count_chunk(src, b, e);
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lid == 0) {  // exclusive prefix over WG chunk counts: negligible next to the chunks
        int acc = 0;
        for (int k = 0; k < WG; ++k) {
            const int c = first[k];
            first[k] = acc;
            acc += c;
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    int col = first[lid];
    for (int i = b; i < e; ++i) {
        if (!NZ(src[i]))
            continue;
        // unravel i over the input dims (right-aligned to MAX_RANK), last dim first
        int rem = i;
        for (int r = rows - 1; r >= 0; --r) {
            const int dim = T_DIM(0, MAX_RANK - rows + r);
            dst[r * count + col] = (long)(rem % dim);
            rem /= dim;
        }
        ++col;
    }
}
