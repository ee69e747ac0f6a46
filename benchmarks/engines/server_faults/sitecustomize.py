"""The rig's faults in every process of a vLLM server (``vllm_server_rig.py`` puts this folder on
the server's PYTHONPATH): ``SRTSCOPE_RIG_FAULT`` names one of ``vllm_driver.py``'s faults (clean:
none), ``SRTSCOPE_RIG_DELAY_MS`` its delay (``every4``: ``SRTSCOPE_RIG_STALL_MS``, 60, in every 4th
``Scheduler.schedule()``). The faults are installed when vLLM's modules are
imported by the process (the engine core's scheduler, the worker's model runner); each process
that injected writes its counts to ``SRTSCOPE_RIG_FAULT_LOG`` (one JSON line per process, at exit
and every few seconds). Under ``srtscope capture`` this file is the sitecustomize that the
capture's own one runs after itself."""
import os
import sys

_FAULT = os.environ.get("SRTSCOPE_RIG_FAULT", "clean")


def _install() -> None:
    import importlib.abc
    import importlib.util
    import json
    import threading
    import time

    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location("_rig_driver", os.path.join(here, "..", "vllm_driver.py"))
    driver = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(driver)
    delay = float(os.environ.get("SRTSCOPE_RIG_DELAY_MS", "20")) / 1e3
    stall = float(os.environ.get("SRTSCOPE_RIG_STALL_MS", "60")) / 1e3
    faults = driver.Faults(delay, sleep=True, alloc_s=delay, stall_s=stall)
    faults.start(_FAULT)
    log = os.environ.get("SRTSCOPE_RIG_FAULT_LOG")
    wanted = {"vllm.v1.core.kv_cache_manager", "vllm.v1.worker.gpu_model_runner", "vllm.v1.engine.output_processor"}
    done = set()

    def write() -> None:
        if log and faults.fired:
            with open(log, "a") as fh:
                fh.write(json.dumps({"pid": os.getpid(), "fault": _FAULT, "fired": faults.fired,
                                     "inside_ms": round(faults.inside_s * 1e3, 3),
                                     "schedule_calls": faults.steps, "t": time.time()}) + "\n")

    def patch(name: str, module) -> None:
        done.add(name)
        if name == "vllm.v1.core.kv_cache_manager":
            faults.wrap(module.KVCacheManager, "new_step_starts", "sched", "every4", count_step=True)
            faults.wrap(module.KVCacheManager, "allocate_slots", "alloc")
        elif name == "vllm.v1.worker.gpu_model_runner":
            faults.wrap(module.GPUModelRunner, "_prepare_inputs", "prep")
        else:
            faults.wrap(module.OutputProcessor, "process_outputs", "result")

        def flush() -> None:
            while True:
                time.sleep(2.0)
                write()
        if len(done) == 1:
            threading.Thread(target=flush, daemon=True).start()

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name not in wanted or name in done:
                return None
            sys.meta_path.remove(self)
            try:
                spec = importlib.util.find_spec(name)
            finally:
                sys.meta_path.insert(0, self)
            if spec is None or spec.loader is None:
                return None
            loader = spec.loader
            orig_exec = loader.exec_module

            def exec_module(module):
                orig_exec(module)
                patch(name, module)
            loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, Finder())


if _FAULT != "clean":
    _install()
