"""NVML absent handled; CUDA-event timer imports and no-ops without CUDA."""
import sys

import pytest

from srtscope.probes.cuda_timer import DeviceTimer, cuda_available
from srtscope.probes.nvml import NvmlSampler


def test_nvml_absent_records_nothing_and_says_why(recorder, monkeypatch):
    class Broken:
        def __getattr__(self, name):
            raise RuntimeError("NVML Shared Library Not Found")

    monkeypatch.setitem(sys.modules, "pynvml", Broken())
    with NvmlSampler(recorder, interval_s=0.001) as sampler:
        pass
    assert not sampler.available
    assert "NVML unavailable" in sampler.reason and "Not Found" in sampler.reason
    assert recorder.counters() == []


def test_nvml_on_this_machine_never_raises(recorder):
    sampler = NvmlSampler(recorder, interval_s=0.001).start()
    sampler.stop()
    if not sampler.available:
        assert sampler.reason and recorder.counters() == []
    else:
        assert {c.name for c in recorder.counters()} <= {"gpu.util_pct", "gpu.sm_clock_mhz",
                                                       "gpu.mem_used_mib", "gpu.power_w"}


def test_nvml_sampler_rejects_bad_interval():
    with pytest.raises(ValueError, match="interval_s"):
        NvmlSampler(interval_s=0)


def test_device_timer_without_cuda_is_a_no_op():
    timer = DeviceTimer()
    with timer.measure("step0"):
        x = 1 + 1
    assert x == 2
    if not cuda_available():
        assert not timer.enabled and timer.collect(synchronize=True) == {}


@pytest.mark.gpu
def test_device_timer_measures_on_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    timer = DeviceTimer()
    a = torch.randn(1024, 1024, device="cuda")
    with timer.measure("mm"):
        for _ in range(10):
            a = a @ a.T / 1024
    done = timer.collect(synchronize=True)
    assert done["mm"] > 0
