// The launch floor's kernel (dyncli bench, engine/launcher.py launch_floor): one small add
// guarded by a size read from a buffer, as a dynamic kernel reads its shape_info. The device
// keeps up with it, so launching it again and again times the host's part of a launch.
__kernel void floor_add(__global const int* s, __global float* a, __global const float* b,
                        __global float* c)
{
    int i = get_global_id(0);
    if (i < s[0]) c[i] = a[i] + b[i];
}
