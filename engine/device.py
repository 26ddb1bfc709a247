"""OpenCL device selection: `--device P:D` or PYOPENCL_CTX (pyopencl's convention); by default
the first GPU, else the first device of any kind (the PoCL CPU device on a machine with no GPU)."""
from __future__ import annotations

import glob
import os
from dataclasses import dataclass

INTEL_CPU_PLATFORM = "Intel(R) OpenCL"


def _intel_cpu_runtime() -> str | None:
    """Path of Intel's CPU OpenCL runtime (libintelocl.so) when the `intel-opencl-rt` wheel is
    installed (pip install 'dyncli[intel]'), else None."""
    from importlib import metadata
    try:
        files = metadata.files("intel-opencl-rt") or []
    except metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.name == "libintelocl.so":
            path = os.path.realpath(f.locate())
            return path if os.path.exists(path) else None
    return None


def register_intel_cpu_runtime() -> str | None:
    """Make Intel's CPU runtime an OpenCL platform. Its wheel installs libintelocl.so under
    <prefix>/lib but registers it nowhere the ICD loader looks (the .icd file it ships names a
    build-machine path), so we point the loader (ocl-icd, pyopencl's own) at a vendors folder of
    ours: the .icd files it would have read (OCL_ICD_VENDORS, else /etc/OpenCL/vendors: GPU
    drivers, the distribution's PoCL) plus one naming libintelocl.so. pyopencl's PoCL stays
    listed (the loader adds it by itself). Must run before the first OpenCL call (the loader
    reads OCL_ICD_VENDORS then); returns the folder, or None when there is nothing to do."""
    lib = _intel_cpu_runtime()
    if lib is None or os.environ.get("DYNCLI_NO_INTEL_OPENCL"):
        return None
    prev = os.environ.get("OCL_ICD_VENDORS") or "/etc/OpenCL/vendors"
    icds = sorted(glob.glob(os.path.join(prev, "*.icd"))) if os.path.isdir(prev) else [prev]
    entries = {}
    for f in icds:
        try:
            with open(f) as fh:
                entries[os.path.basename(f)] = fh.read().strip()
        except OSError:
            continue
    if any(os.path.basename(v) == "libintelocl.so" or v == lib for v in entries.values()):
        return None    # already registered
    entries["intel-cpu-dyncli.icd"] = lib
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    folder = os.path.join(base, "dyncli", "opencl-vendors")
    try:
        os.makedirs(folder, exist_ok=True)
        for name in set(os.listdir(folder)) - set(entries):
            if name.endswith(".icd"):
                os.remove(os.path.join(folder, name))
        for name, target in entries.items():
            tmp = os.path.join(folder, f".{name}.{os.getpid()}")
            with open(tmp, "w") as fh:
                fh.write(target + "\n")
            os.replace(tmp, os.path.join(folder, name))   # atomic: other processes may read it
    except OSError:
        return None
    os.environ["OCL_ICD_VENDORS"] = folder
    return folder


register_intel_cpu_runtime()

import pyopencl as cl  # noqa: E402  (after the loader's environment is set)


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


# CPU platforms in the default order (lower first; unlisted: 0). PoCL is the CPU device pip
# brings; Intel's runtime is installed only on purpose (pip install 'dyncli[intel]', or
# scripts/ensure-opencl.sh where PoCL cannot run the kernels) and, once installed, is preferred.
# The PyPI PoCL (3.0, LLVM 14) compiles for znver3 on AVX-512 CPUs (AMD Zen 4) and aborts in
# code generation on 16-lane vector kernels ("Do not know how to scalarize this operator's
# operand", gemm_rb) or segfaults: there Intel's runtime is the working CPU device.
# Measured on a shared 2-core AMD EPYC (Zen 5), scripts/bench_models.py, same runs as
# onnxruntime (docs/performance.md has the table): Intel's runtime was faster on the transformer
# encoder (1x128: 4.3 vs 21.0 ms) and densenet121 (601 vs 1531 ms) but slower on squeezenet
# (222 vs 70 ms; 316 vs 45 ms with the tiled conv, whose tiles were measured on PoCL), and its
# worker threads fell apart when the cores were oversubscribed (encoder 1x16: 28 vs 1.8 ms);
# its wheels also weigh about 0.6 GB. Cold kernel builds were faster on Intel's (docs/performance.md).
CPU_PLATFORM_ORDER = {INTEL_CPU_PLATFORM: -1}


def select_device(spec: str | None = None) -> cl.Device:
    """`spec`: "P:D" (pyopencl's PYOPENCL_CTX form), a platform or device name substring
    ("intel", "pocl"), or None: the first GPU, else the first CPU device that builds kernels
    (CPU_PLATFORM_ORDER)."""
    dev = _select_device(spec)
    _kind["last"] = device_kind(dev)
    return dev


def _select_device(spec: str | None = None) -> cl.Device:
    spec = spec or os.environ.get("PYOPENCL_CTX") or None
    plats = _platforms()
    if spec and not spec.replace(":", "").isdigit():
        # a name: the first device whose platform or device name contains it ("intel", "pocl")
        for p in plats:
            for d in p.get_devices():
                if spec.lower() in f"{p.name} {d.name}".lower() or \
                        (spec.lower() == "pocl" and "portable computing" in p.name.lower()):
                    if probe(d) is None:
                        return d
        known = ", ".join(f"{d.index} {d.platform}" for d in list_devices())
        raise DeviceError(f"no working OpenCL device matches {spec!r} (known: {known})")
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
    devs.sort(key=lambda d: (0 if d.type & cl.device_type.GPU else 1,
                             CPU_PLATFORM_ORDER.get(d.platform.name.strip(), 0)))
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
