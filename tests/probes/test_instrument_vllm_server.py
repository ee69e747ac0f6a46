"""A vLLM server's engine core and its worker are two processes: each step the engine core sends the
batch (``MultiprocExecutor.collective_rpc``), waits for the worker's answer (``FutureWrapper.result``)
and reads it back. Under ``capture --instrument vllm`` that crossing is ``sync.wait``: while the
worker idles between messages, the engine core is blocked on it too, so neither works on a stage:
the device's gap is the hand-off between them (``handoff``), neither the scheduler's own time nor
unannotated host time. A scheduler stall is still named and recovered.

A fake vLLM shaped by the declared table (``fake_engine.py``): the engine core's steps on this
thread, the worker's on another (one probe trace, as ``--server --probe`` merges the processes')."""
from __future__ import annotations

import queue
import threading
import time

from srtscope.analyzers.diagnose import diagnose
from srtscope.analyzers.readers import load_timeline
from srtscope.probes.export import write_probe_trace

MS = 1_000_000
FORWARD_S = 0.012
IPC_S = 0.0008          # each message's way (unannotated on the worker: it idles or unpickles)
STEPS = 12


def _serve(steps: int, sched_s: float) -> None:
    """``steps`` engine-core steps (EngineCore.step: schedule, send, wait, update) against a worker
    thread that receives, prepares, runs the forward and samples, and answers."""
    from vllm._fake_out import HOOKS
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.executor.multiproc_executor import FutureWrapper, MultiprocExecutor
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    requests: queue.Queue = queue.Queue()
    answers: queue.Queue = queue.Queue()

    def worker() -> None:
        runner = GPUModelRunner()
        while requests.get() is not None:        # idle: waiting for the engine core's message
            time.sleep(IPC_S)                    # the message read (no stage)
            runner._prepare_inputs(sleep_s=0.0005)
            runner._model_forward(sleep_s=FORWARD_S)
            runner._sample(sleep_s=0.0005)
            time.sleep(IPC_S)                    # the answer written (no stage)
            answers.put(1)

    def core_step(x):
        Scheduler().schedule({"r0": 1, "r1": 1})
        MultiprocExecutor().collective_rpc()
        FutureWrapper().result()
        Scheduler().update_from_output()

    HOOKS.update({"Scheduler.schedule": lambda x: time.sleep(sched_s) if sched_s else None,
                  "MultiprocExecutor.collective_rpc": lambda x: requests.put(1),
                  "FutureWrapper.result": lambda x: answers.get(),
                  "EngineCore.step": core_step})
    th = threading.Thread(target=worker)
    th.start()
    try:
        for _ in range(steps):
            EngineCore().step()
    finally:
        requests.put(None)
        th.join()


def _diagnosed(rec, tmp_path, name: str) -> tuple[dict, int]:
    d = diagnose(load_timeline([write_probe_trace(rec, tmp_path / name)])).to_json()
    return d, int(d["steps"]["count"])


def test_the_crossing_to_the_worker_is_sync_wait_and_charged_to_the_handoff(fake_vllm, tmp_path):
    _serve(STEPS, 0.0)
    spans = fake_vllm.raw_spans()
    waits = [s for s in spans if s[0] == "sync.wait"]
    assert {(s[5] or {}).get("part") for s in waits} == {"rpc", "worker"}
    assert len({s[3] for s in spans}) == 2             # engine core and worker threads
    d, steps = _diagnosed(fake_vllm, tmp_path, "clean.json.gz")
    assert steps == STEPS
    v = d["verdict"]
    assert v["bottleneck"] != "scheduler", v["headline"]
    # the messages' way (2 x IPC_S a step) is the hand-off: not unannotated host time, and not the
    # scheduler's (its own schedule and update take microseconds here)
    assert v["causes_ns"].get("host_unattributed", 0) / steps < 0.25 * IPC_S * 1e9
    assert v["causes_ns"].get("handoff", 0) / steps >= 1.5 * IPC_S * 1e9
    assert v["scores_ns"].get("scheduler", 0) / steps < 0.25 * IPC_S * 1e9


def test_a_scheduler_stall_on_a_server_is_named_and_recovered(fake_vllm, tmp_path):
    def schedule_ns() -> float:
        return sum(e - s for n, s, e, _t, _d, _a in fake_vllm.raw_spans() if n == "sched.schedule") / STEPS

    _serve(STEPS, 0.0)
    clean, steps = _diagnosed(fake_vllm, tmp_path, "clean.json.gz")
    clean_schedule = schedule_ns()
    fake_vllm.clear()
    _serve(STEPS, 0.015)
    d, steps2 = _diagnosed(fake_vllm, tmp_path, "sched.json.gz")
    v = d["verdict"]
    assert (v["bottleneck"], v["cause"]) == ("scheduler", "sched_cpu")
    injected = schedule_ns() - clean_schedule            # the stall as measured inside schedule()
    recovered = v["scores_ns"]["scheduler"] / steps2 - clean["verdict"]["scores_ns"]["scheduler"] / steps
    assert abs(recovered - injected) <= 0.15 * injected, (recovered, injected)
