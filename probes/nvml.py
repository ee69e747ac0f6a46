"""NVML sampler: GPU utilisation, SM clock, memory used and power as counter tracks.

Where NVML or a GPU is missing it says so once (``reason``, and one log line) and records nothing.
Counter names: ``gpu.util_pct``, ``gpu.sm_clock_mhz``, ``gpu.mem_used_mib``, ``gpu.power_w``.
"""
from __future__ import annotations

import logging
import threading
from time import perf_counter_ns
from typing import Any

from srtscope.probes.recorder import Recorder, get_recorder

log = logging.getLogger("srtscope.probes")

COUNTERS = ("gpu.util_pct", "gpu.sm_clock_mhz", "gpu.mem_used_mib", "gpu.power_w")


class NvmlSampler:
    """Background sampler; ``start()`` returns self, ``available`` tells whether it samples."""

    def __init__(self, recorder: Recorder | None = None, interval_s: float = 0.05,
                 devices: list[int] | None = None) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.recorder = recorder or get_recorder()
        self.interval_s = interval_s
        self.devices = devices
        self.available = False
        self.reason = ""
        self.samples = 0
        self._nvml: Any = None
        self._handles: list[tuple[int, Any]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _init(self) -> bool:
        try:
            import pynvml  # type: ignore  # nvidia-ml-py

            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            ids = self.devices if self.devices is not None else list(range(count))
            self._handles = [(i, pynvml.nvmlDeviceGetHandleByIndex(i)) for i in ids if i < count]
            if not self._handles:
                self.reason = "NVML found no GPU"
                return False
            self._nvml = pynvml
            return True
        except Exception as exc:  # library missing, driver missing, no GPU
            self.reason = f"NVML unavailable: {type(exc).__name__}: {exc}".strip()
            return False

    def sample_once(self) -> int:
        """Take one sample of every counter on every device; returns the number recorded."""
        if self._nvml is None:
            return 0
        nv, n = self._nvml, 0
        for dev, h in self._handles:
            t = perf_counter_ns()
            readings = []
            try:
                readings.append(("gpu.util_pct", nv.nvmlDeviceGetUtilizationRates(h).gpu))
                readings.append(("gpu.sm_clock_mhz", nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)))
                readings.append(("gpu.mem_used_mib", nv.nvmlDeviceGetMemoryInfo(h).used / 2**20))
                readings.append(("gpu.power_w", nv.nvmlDeviceGetPowerUsage(h) / 1000.0))
            except Exception:
                pass  # a counter the device does not support: keep the others
            for name, value in readings:
                self.recorder.add_counter(name, t, float(value), dev)
                n += 1
        self.samples += 1
        return n

    def start(self) -> NvmlSampler:
        self.available = self._init()
        if not self.available:
            log.info("srtscope: %s; no GPU counters recorded", self.reason)
            return self
        self._thread = threading.Thread(target=self._run, name="srtscope-nvml", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample_once()
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
            self._nvml = None

    def __enter__(self) -> NvmlSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
