"""OpenCL device selection: `--device P:D` or PYOPENCL_CTX (pyopencl's convention); by default
the first GPU, else the first device of any kind (the PoCL CPU device on a machine with no GPU)."""
from __future__ import annotations

import os
from dataclasses import dataclass

import pyopencl as cl


class DeviceError(RuntimeError):
    pass


@dataclass
class DeviceInfo:
    index: str
    platform: str
    name: str
    type: str
    version: str
    global_mem: int
    compute_units: int


def _platforms():
    try:
        return cl.get_platforms()
    except cl.Error as e:  # no ICD loader entries at all
        raise DeviceError(f"no OpenCL platform found ({e}); install pocl-binary-distribution") from None


def list_devices() -> list[DeviceInfo]:
    out = []
    for pi, p in enumerate(_platforms()):
        for di, d in enumerate(p.get_devices()):
            out.append(DeviceInfo(f"{pi}:{di}", p.name, d.name.strip(), cl.device_type.to_string(d.type),
                                  d.version, d.global_mem_size, d.max_compute_units))
    return out


# The kind ("cpu" | "gpu") of the device select_device() last returned: ops whose kernel
# parameters differ per device kind (engine/ops/conv.py) read it when they make their kernel
# calls (one device per process is the norm; a Network on another device still runs correctly,
# with the other kind's parameters).
_kind = {"last": "cpu"}


def device_kind(dev: cl.Device | None = None) -> str:
    if dev is None:
        return _kind["last"]
    return "cpu" if dev.type & cl.device_type.CPU else "gpu"


def select_device(spec: str | None = None) -> cl.Device:
    dev = _select_device(spec)
    _kind["last"] = device_kind(dev)
    return dev


def _select_device(spec: str | None = None) -> cl.Device:
    spec = spec or os.environ.get("PYOPENCL_CTX") or None
    plats = _platforms()
    if spec:
        try:
            parts = [int(x) for x in spec.split(":")]
            p = plats[parts[0]]
            devs = p.get_devices()
            return devs[parts[1] if len(parts) > 1 else 0]
        except (ValueError, IndexError):
            known = ", ".join(d.index for d in list_devices())
            raise DeviceError(f"no OpenCL device {spec!r} (known: {known}; see `dyncli devices`)") from None
    devs = [d for p in plats for d in p.get_devices()]
    if not devs:
        raise DeviceError("no OpenCL device found")
    # GPUs first; then the first device whose compiler works. (The PyPI PoCL is built on LLVM
    # 14, which cannot target CPUs newer than it, e.g. AMD Zen 5: "unknown target CPU".)
    devs.sort(key=lambda d: 0 if d.type & cl.device_type.GPU else 1)
    errors = []
    for d in devs:
        err = probe(d)
        if err is None:
            return d
        errors.append(f"{d.name.strip()}: {err}")
    raise DeviceError("no OpenCL device can build kernels (" + "; ".join(errors) + "); on "
                      "Debian/Ubuntu `apt-get install pocl-opencl-icd` adds a working CPU device")


_PROBED: dict = {}


def probe(dev: cl.Device) -> str | None:
    """Build a trivial kernel on `dev`; None when it works, else the first line of the error."""
    key = (dev.platform.name, dev.name, dev.version)
    if key not in _PROBED:
        try:
            ctx = cl.Context([dev])
            cl.Program(ctx, "__kernel void probe(__global int* a) { a[0] = 1; }").build()
            _PROBED[key] = None
        except cl.Error as e:
            lines = [l.strip() for l in str(e).splitlines() if "error" in l.lower() and l.strip()]
            _PROBED[key] = (lines[-1] if lines else str(e).splitlines()[0])[:200]
    return _PROBED[key]


def describe(dev: cl.Device) -> str:
    return f"{dev.name.strip()} ({dev.platform.name.strip()}, {dev.version.strip()})"
