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


class _FakeEvent:
    """Stands in for ``torch.cuda.Event``: a clock read at ``record``; ``query`` is False until
    ``synchronize`` when ``lazy`` (an event the device has not reached yet)."""

    lazy = False

    def __init__(self, enable_timing=False):
        self.t, self.done = None, not _FakeEvent.lazy

    def record(self):
        import time

        self.t = time.perf_counter_ns()

    def query(self):
        return self.done

    def synchronize(self):
        self.done = True

    def elapsed_time(self, end):
        return (end.t - self.t) / 1e6        # ms, as CUDA events report


@pytest.fixture
def fake_cuda(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(_FakeEvent, "lazy", False)
    return _FakeEvent


def test_device_timer_fills_keys_and_span_attributes(fake_cuda):
    import time

    timer = DeviceTimer(enabled=True)
    attrs = {"bs": 4}
    with timer.measure("step0"):
        time.sleep(0.002)
    with timer.measure(attrs=attrs):
        time.sleep(0.001)
    with timer.measure():                       # nowhere to report: not recorded
        pass
    assert timer.pending == 2
    done = timer.collect()
    assert set(done) == {"step0"} and done["step0"] >= 2_000_000 and timer.results == done
    assert attrs["bs"] == 4 and attrs["device_ns"] >= 1_000_000 and timer.pending == 0


def test_device_timer_collect_does_not_block_unless_asked(fake_cuda):
    fake_cuda.lazy = True
    timer = DeviceTimer(enabled=True)
    attrs: dict = {}
    with timer.measure(attrs=attrs):
        pass
    assert timer.collect() == {} and "device_ns" not in attrs and timer.pending == 1
    timer.collect(synchronize=True)
    assert "device_ns" in attrs and timer.pending == 0


def test_device_timer_disabled_records_nothing(fake_cuda):
    timer = DeviceTimer(enabled=False)
    attrs: dict = {}
    with timer.measure("k", attrs):
        pass
    assert timer.pending == 0 and timer.collect(synchronize=True) == {} and attrs == {}
