"""Kineto reader: the real traces in ../shared (current, ROCm and 2021 schemas) and small cases."""
from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path

import pytest

from srtscope.analyzers.model.timeline import (
    GPU_DOMAIN,
    OP_DOMAIN,
    PYTHON_DOMAIN,
    DeviceKind,
    SourceFormat,
    Traced,
    WarningCode,
)
from srtscope.analyzers.readers import TraceError, load_timeline
from srtscope.analyzers.readers.detect import detect_format
from srtscope.analyzers.readers.jsonstream import us_to_ns
from srtscope.analyzers.readers.kineto import read_kineto
from tests.conftest import REAL_TRACES as REAL

KINETO = REAL / "kineto"
needs_real = pytest.mark.usefixtures("real_traces")   # conftest: skips without the shared traces
MANIFEST = json.loads((REAL / "manifest.json").read_text())["kineto"] if KINETO.is_dir() else {}
TORCHREC = KINETO / "hta_torchrec_train_a100_rank0of16_cudagraph_nccl.json.gz"


@needs_real
@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_real_trace_counts_match_manifest(name):
    m = MANIFEST[name]
    tl = read_kineto(KINETO / name)
    kinds = tl.device["kind"].value_counts().to_dict()
    assert kinds.get(DeviceKind.KERNEL.value, 0) == m["kernels"]
    assert kinds.get(DeviceKind.MEMCPY.value, 0) == m["memcpy"]
    assert len(tl.api) == m["runtime"] + m["driver"]
    # no cpu_op is a stage alias: operators and Python frames go to domains of their own
    assert len(tl.host_ranges) == m["user_annot"] + (0 if tl.meta.extra["kineto.legacy_2021"] else 0)
    assert len(tl.domain_ranges(GPU_DOMAIN)) == m["gpu_user_annot"]
    if not tl.meta.extra["kineto.legacy_2021"]:
        assert len(tl.domain_ranges(OP_DOMAIN)) == m["cpu_op"]
    assert len(tl.domain_ranges(PYTHON_DOMAIN)) == m["python_function"]
    assert tl.meta.ranks == [m["rank"] or 0]
    assert tl.meta.world_size == (m["world"] or 1)
    assert tl.meta.extra["kineto.events"] == m["events"]
    assert (tl.device["end_ns"] >= tl.device["start_ns"]).all()
    # kernels link to their launch through (pid, correlation), except those launched before the
    # profiler started (correlation below the first recorded launch)
    launches = set(zip(tl.api["pid"], tl.api["correlation"]))
    k = tl.device[tl.device["kind"] == "kernel"]
    in_window = k[k["correlation"] >= tl.api["correlation"].min()]
    linked = sum(key in launches for key in zip(k["pid"], k["correlation"]))
    assert linked == len(in_window) and linked > len(k) // 2


@needs_real
def test_graph_launches_correlate_to_their_kernels():
    tl = read_kineto(TORCHREC)
    g = tl.api[tl.api["kind"] == "graph_launch"]
    assert len(g) == 70 and set(g["name"]) == {"cudaGraphLaunch"}
    k = tl.device[(tl.device["kind"] == "kernel") & tl.device["correlation"].isin(g["correlation"])]
    assert len(k) == 135
    assert k["correlation"].nunique() == 70           # every graph launch ran kernels
    # graph kernels start after their launch call began
    starts = g.set_index("correlation")["start_ns"]
    assert (k["start_ns"].to_numpy() >= starts.loc[k["correlation"]].to_numpy()).all()
    assert Traced.GRAPH_NODES in tl.meta.traced
    assert tl.meta.extra["kineto.graph_kernels"] == 135
    assert tl.meta.world_size == 16


@needs_real
def test_rocm_hip_names_mapped_to_cuda():
    tl = read_kineto(KINETO / "tracelens_vllm_mi300_piecewise_hipgraph_replay_ROCm.json.gz")
    names = set(tl.api["name"].astype(str))
    assert not any(n.startswith("hip") for n in names)
    assert (tl.api["kind"] == "graph_launch").sum() == 25
    assert tl.meta.extra["kineto.rocm"] is True
    # ts with ns decimals relative to baseTimeNanoseconds -> absolute integer ns
    assert tl.device["start_ns"].min() > 1_767_189_312_000_000_000


@needs_real
def test_legacy_2021_schema():
    tl = read_kineto(KINETO / "kineto_tbplugin_resnet50_v100_2021_legacy.json.gz")
    assert tl.meta.extra["kineto.legacy_2021"] is True
    assert set(tl.device["stream"]) == {7}             # tid "stream 7"
    assert 25738 in set(tl.api["tid"])                 # tid "25738" (a string in 2021)
    assert tl.meta.has_warning(WarningCode.NO_NVTX)
    assert tl.meta.devices[0].name == "Tesla V100-DGXS-32GB"


@needs_real
def test_driver_launch_and_distributed_info():
    tl = read_kineto(KINETO / "hta_triton_single_kernel_a100.json.gz")
    assert "cuLaunchKernel" in set(tl.api["name"].astype(str))
    k = tl.device[tl.device.kind == "kernel"].iloc[0]
    launch = tl.api[tl.api["correlation"] == k["correlation"]]
    assert list(launch["name"]) == ["cuLaunchKernel"] and list(launch["kind"]) == ["launch"]
    ddp = read_kineto(KINETO / "hta_ddp_convnet_a100_rank0of2_nccl_comm_args.json.gz")
    assert ddp.meta.extra["kineto.distributed"]["backend"] == "nccl"
    gpu = ddp.ranges[ddp.ranges["domain"] == GPU_DOMAIN]
    assert len(gpu) == 30 and len(ddp.host_ranges) == 42


@needs_real
def test_plain_json_and_content_detection(tmp_path):
    src = KINETO / "hta_alexnet_a100_single.json.gz"
    plain = tmp_path / "trace.bin"                    # extension says nothing
    plain.write_bytes(gzip.decompress(src.read_bytes()))
    disguised = tmp_path / "trace.sqlite"
    shutil.copy(src, disguised)
    assert detect_format(plain) is SourceFormat.KINETO
    assert detect_format(disguised) is SourceFormat.KINETO
    a, b = read_kineto(plain), read_kineto(disguised)
    assert a.device.equals(b.device) and len(a.api) == 361


@needs_real
def test_two_ranks_merge(tmp_path):
    src = json.loads(gzip.decompress((KINETO / "hta_alexnet_a100_single.json.gz").read_bytes()))
    paths = []
    for r in (0, 1):
        src["distributedInfo"] = {"rank": r, "world_size": 2}
        p = tmp_path / f"t{r}.json"
        p.write_text(json.dumps(src))
        paths.append(p)
    tl = load_timeline(paths[::-1])
    assert tl.meta.ranks == [0, 1] and tl.meta.world_size == 2
    assert tl.device.groupby("rank").size().to_dict() == {0: 98, 1: 98}


def _trace(tmp_path: Path, events: list, **top) -> Path:
    p = tmp_path / "k.json"
    p.write_text(json.dumps({"schemaVersion": 1, **top, "traceEvents": events}))
    return p


def test_stage_alias_cpu_ops_are_stages_other_ops_are_operators(tmp_path):
    ev = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 2, "ts": 10, "dur": 5},
          {"ph": "X", "cat": "cpu_op", "name": "execute_model", "pid": 1, "tid": 2, "ts": 5,
           "dur": 50},
          {"ph": "X", "cat": "user_annotation", "name": "sched.schedule bs=4", "pid": 1, "tid": 2,
           "ts": 1, "dur": 3},
          {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 2,
           "ts": 12, "dur": 2, "args": {"correlation": 9}},
          {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 15, "dur": 4,
           "args": {"device": 0, "stream": 7, "correlation": 9}}]
    tl = read_kineto(_trace(tmp_path, ev, baseTimeNanoseconds=1_000_000_000))
    assert sorted(tl.host_ranges["name"].astype(str)) == ["execute_model", "sched.schedule"]
    assert list(tl.domain_ranges(OP_DOMAIN)["name"].astype(str)) == ["aten::mm"]
    assert tl.ranges.loc[tl.ranges.name == "sched.schedule", "attrs"].iloc[0] == {"bs": "4"}
    k = tl.device.iloc[0]
    assert (k["start_ns"], k["end_ns"], k["pid"]) == (1_000_015_000, 1_000_019_000, 1)


def test_cpu_capture_of_our_engine_gets_forward_stand_ins(tmp_path):
    # scenario: `srtscope capture --backend torch` of a CPU run: no device activity, but the stage
    # annotations name the forwards, which stand in for device rows (as in probe traces)
    ann = lambda name, ts, dur, tid=2: {"ph": "X", "cat": "user_annotation", "name": name,  # noqa: E731
                                        "pid": 1, "tid": tid, "ts": ts, "dur": dur}
    ev = [ann("loop.step step=0 mode=decode", 0, 100), ann("prep.batch", 5, 20),
          ann("run.eager bs=4 reason=no_cuda", 30, 50, tid=3), ann("sched.result", 85, 10),
          {"ph": "X", "cat": "gpu_user_annotation", "name": "run.eager", "pid": 0, "tid": 7,
           "ts": 31, "dur": 40},                                   # a projection: never a stand-in
          {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 3, "ts": 35, "dur": 5}]
    tl = read_kineto(_trace(tmp_path, ev))
    assert tl.device[["start_ns", "end_ns"]].values.tolist() == [[30_000, 80_000]]
    assert tl.device["kind"].tolist() == [DeviceKind.CPU_FORWARD.value] and tl.device["pid"].tolist() == [1]
    assert tl.meta.has_warning(WarningCode.CPU_STAND_IN) and not tl.meta.has_warning(WarningCode.NO_KERNELS)
    assert Traced.KERNELS in tl.meta.traced and Traced.MEMCPY not in tl.meta.traced


def test_gpu_capture_that_lost_its_kernels_gets_no_stand_ins(tmp_path):
    # scenario: CUPTI kernel tracing failed (permissions): CUDA calls, annotations, no kernels.
    # The host's run.eager spans are not device activity here: say that kernels are missing.
    ev = [{"ph": "X", "cat": "user_annotation", "name": "run.eager", "pid": 1, "tid": 2, "ts": 0, "dur": 50},
          {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 2, "ts": 5,
           "dur": 4, "args": {"correlation": 1}}]
    tl = read_kineto(_trace(tmp_path, ev))
    assert len(tl.device) == 0 and tl.meta.has_warning(WarningCode.NO_KERNELS)
    assert not tl.meta.has_warning(WarningCode.CPU_STAND_IN)
    with pytest.raises(TraceError, match="zero kernels"):
        load_timeline([_trace(tmp_path, ev)])


@pytest.mark.parametrize("case, ev, says", [
    # a CPU-only profile of a process that ran no model: SGLang's launcher under `--backend torch`
    # without `--instrument` (its scheduler and model run in processes of their own)
    ("no CUDA calls, no engine range", [
        {"ph": "X", "cat": "user_annotation", "name": "my_step", "pid": 1, "tid": 2, "ts": 0, "dur": 9},
        {"ph": "X", "cat": "cpu_op", "name": "aten::to", "pid": 1, "tid": 2, "ts": 1, "dur": 2}],
     "no CUDA calls and no engine step or forward range: the profiled process ran no model step"),
    # a GPU capture whose kernel tracing failed: its CUDA calls are there
    ("CUDA calls, no kernels", [
        {"ph": "X", "cat": "user_annotation", "name": "my_step", "pid": 1, "tid": 2, "ts": 0, "dur": 9},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 2, "ts": 5,
         "dur": 4, "args": {"correlation": 1}}],
     "no other device activity (was CUDA/GPU tracing enabled?)"),
])
def test_a_capture_without_our_stages_is_refused_saying_what_it_lacks(tmp_path, case, ev, says):
    with pytest.raises(TraceError, match=re.escape(says)):
        load_timeline([_trace(tmp_path, ev)])


def test_exact_ns_from_decimal_microseconds():
    assert us_to_ns("1695835543008415.123") == 1_695_835_543_008_415_123
    assert us_to_ns(12) == 12_000 and us_to_ns(4.07) == 4_070 and us_to_ns("-1.5") == -1_500


@pytest.mark.parametrize("doc,msg", [
    ({"traceEvents": []}, "holds no GPU"),
    ({"foo": 1}, "not a trace"),
    ({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k"}]}, "without 'ts'"),
])
def test_bad_kineto_documents(tmp_path, doc, msg):
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(TraceError, match=msg) as ei:
        load_timeline([p])
    assert str(ei.value).startswith(f"{p}: ") and "\n" not in str(ei.value)


def test_flows_link_events_without_args_correlation(tmp_path):
    ev = [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 2,
           "ts": 12, "dur": 2},
          {"ph": "s", "cat": "ac2g", "id": 77, "pid": 1, "tid": 2, "ts": 12, "name": "ac2g"},
          {"ph": "f", "cat": "ac2g", "id": 77, "pid": 0, "tid": 7, "ts": 15, "name": "ac2g",
           "bp": "e"},
          {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 15, "dur": 4,
           "args": {"device": 0, "stream": 7}},
          {"ph": "X", "cat": "kernel", "name": "orphan", "pid": 0, "tid": 7, "ts": 30, "dur": 1}]
    tl = read_kineto(_trace(tmp_path, ev))
    assert list(tl.api["correlation"]) == [77]
    assert list(tl.device["correlation"]) == [77, -1]


@pytest.mark.parametrize("chunk", [7, 64, 1 << 20])
def test_stream_parser_across_chunk_boundaries(chunk):
    import io

    from srtscope.analyzers.readers.jsonstream import iter_trace
    doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "x" * 50}],
           "traceEvents": [{"ph": "X", "ts": f"@{i}", "dur": 1234567,
                            "name": f"k{i}", "args": {"s": "a,b]}" * 5}} for i in range(40)],
           "distributedInfo": {"rank": 3}}
    header = {}
    text = json.dumps(doc)
    for i in range(40):          # exact decimal µs literals, as newer Kineto writes them
        text = text.replace(f'"@{i}"', f"16958355430084{i:02d}.123")
    events = list(iter_trace(io.StringIO(text), header.__setitem__, chunk=chunk))
    assert [e["name"] for e in events] == [f"k{i}" for i in range(40)]
    assert header["distributedInfo"] == {"rank": 3} and header["schemaVersion"] == 1
    assert events[0]["dur"] == 1234567
    assert [us_to_ns(e["ts"]) for e in events[:2]] == [1695835543008400123, 1695835543008401123]
