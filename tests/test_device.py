"""Device selection: Intel's CPU runtime registered with the ICD loader through a vendors folder
of ours (the files, checked without loading the runtime), and selection by name."""
import os

import pytest

from engine import device as dm


def test_register_intel_cpu_runtime_writes_vendors_folder(tmp_path, monkeypatch):
    system = tmp_path / "system"
    system.mkdir()
    (system / "nvidia.icd").write_text("libnvidia-opencl.so.1\n")
    (system / "pocl.icd").write_text("libpocl.so.2\n")
    lib = tmp_path / "lib" / "libintelocl.so"
    lib.parent.mkdir()
    lib.write_text("")
    monkeypatch.setattr(dm, "_intel_cpu_runtime", lambda: str(lib))
    monkeypatch.setenv("OCL_ICD_VENDORS", str(system))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("DYNCLI_NO_INTEL_OPENCL", raising=False)
    folder = dm.register_intel_cpu_runtime()
    assert folder == str(tmp_path / "cache" / "dyncli" / "opencl-vendors")
    assert os.environ["OCL_ICD_VENDORS"] == folder
    files = {f: open(os.path.join(folder, f)).read().strip() for f in sorted(os.listdir(folder))}
    # the loader's own .icd files are kept (GPU drivers, the distribution's PoCL), Intel's added
    assert files == {"intel-cpu-dyncli.icd": str(lib), "nvidia.icd": "libnvidia-opencl.so.1",
                     "pocl.icd": "libpocl.so.2"}
    # registered already: nothing to do
    assert dm.register_intel_cpu_runtime() is None


def test_register_intel_cpu_runtime_opt_out(tmp_path, monkeypatch):
    monkeypatch.setattr(dm, "_intel_cpu_runtime", lambda: str(tmp_path / "libintelocl.so"))
    monkeypatch.setenv("DYNCLI_NO_INTEL_OPENCL", "1")
    monkeypatch.setenv("OCL_ICD_VENDORS", str(tmp_path))
    assert dm.register_intel_cpu_runtime() is None
    assert os.environ["OCL_ICD_VENDORS"] == str(tmp_path)


def test_select_device_by_name(device):
    p = device.platform.name
    dev = dm.select_device("pocl" if "Portable" in p else p.split()[0])
    assert dev.platform.name == p
    with pytest.raises(dm.DeviceError, match="no working OpenCL device matches"):
        dm.select_device("no-such-device-xyz")
