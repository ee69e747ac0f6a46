"""nsys SQLite reader: real exports of six nsys versions, and files from the schema writer."""
from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from sample_traces.nsys_schema import NsysWriter
from srtscope.analyzers.model.timeline import DeviceKind, SourceFormat, Traced, WarningCode
from srtscope.analyzers.readers import TraceError, load_timeline
from srtscope.analyzers.readers.nsys_sqlite import read_nsys
from tests.conftest import REAL_TRACES as REAL

NSYS = REAL / "nsys"
needs_real = pytest.mark.usefixtures("real_traces")   # conftest: skips without the shared traces
MANIFEST = json.loads((REAL / "manifest.json").read_text())["nsys"] if NSYS.is_dir() else {}
FILES = sorted(MANIFEST)


def _sql(path: Path, q: str):
    con = sqlite3.connect(f"{path.as_uri()}?mode=ro&immutable=1", uri=True)
    try:
        return con.execute(q).fetchall()
    finally:
        con.close()


@needs_real
@pytest.mark.parametrize("name", FILES)
def test_real_export_counts_match_manifest(name):
    m = MANIFEST[name]
    path = NSYS / name
    tl = read_nsys(path)
    kinds = tl.device["kind"].value_counts().to_dict()
    assert kinds.get(DeviceKind.KERNEL.value, 0) == m["kernels"]
    assert kinds.get(DeviceKind.MEMCPY.value, 0) == m["memcpy"]
    assert kinds.get(DeviceKind.MEMSET.value, 0) == (m["memset"] or 0)
    dup = _sql(path, "SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE eventClass = 67")[0][0]
    cuda = tl.api[~tl.api["kind"].astype(str).str.startswith("os_")]
    assert len(cuda) == m["runtime"] - dup
    assert len(tl.api) - len(cuda) == (m.get("osrt") or 0)      # OS runtime calls, when traced
    ranges_expected = sum(c for t, c in (m["nvtx_types"] or []) if t in (35, 59, 60))
    assert len(tl.ranges) == ranges_expected
    assert tl.meta.format is SourceFormat.NSYS_SQLITE
    assert tl.meta.extra["nsys.schema_version"] == m["schema"]
    assert tl.meta.tool_version == m["version"]
    assert not tl.meta.has_warning(WarningCode.UNKNOWN_SCHEMA)
    assert (tl.device["end_ns"] >= tl.device["start_ns"]).all()
    assert tl.device["start_ns"].is_monotonic_increasing


@needs_real
def test_2022_duplicate_runtime_rows_dropped_and_suffix_stripped():
    tl = read_nsys(NSYS / "saxpy_mpi_cuda_a100_nvtx_nsys2022.2.sqlite")
    assert len(tl.api) == 95 - 38
    assert not tl.api["name"].astype(str).str.contains(r"_v\d+$").any()
    assert "cudaHostRegister" in set(tl.api["name"].astype(str))
    # the same call is not there twice
    assert not tl.api.duplicated(["pid", "correlation", "start_ns"]).any()


@needs_real
def test_pid_tid_decoding_matches_global_tid():
    path = NSYS / "cupy_power_iteration_t4_nvtx_nsys2025.3.sqlite"
    tl = read_nsys(path)
    gtid = _sql(path, "SELECT DISTINCT globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME")
    want = {((g >> 24) & 0xFFFFFF, g & 0xFFFFFF) for (g,) in gtid}
    cuda = tl.api[~tl.api["kind"].astype(str).str.startswith("os_")]
    assert set(zip(cuda["pid"], cuda["tid"])) == want
    assert set(tl.api["pid"]) == {9946}              # PROCESSES: 'python' pid 9946
    assert set(tl.device["pid"]) == {9946}
    assert tl.meta.extra["nsys.process_names"] == {9946: "python"}
    # kernels join their launches on (pid, correlation): every kernel here has one
    launches = set(zip(tl.api["pid"], tl.api["correlation"]))
    k = tl.device[tl.device["kind"] == "kernel"]
    assert all(key in launches for key in zip(k["pid"], k["correlation"]))


@needs_real
def test_nvtx_names_domains_and_depth():
    tl = read_nsys(NSYS / "cupy_power_iteration_t4_nvtx_nsys2025.3.sqlite")
    r = tl.ranges
    assert set(r["domain"].astype(str)) == {"", "CCCL"}
    cccl = r[r["domain"] == "CCCL"]
    assert set(cccl["name"].astype(str)) == {"cub::DeviceReduce::Sum"}  # registered strings (textId)
    names = set(r["name"].astype(str))
    assert "Step 0 to 10" in names                     # spaces without k=v: the whole label kept
    assert (r["depth"] >= 0).all() and r["depth"].max() >= 1
    loop = r[r["name"] == "Loop"]
    inside = r[(r["start_ns"] > loop["start_ns"].iloc[0]) & (r["end_ns"] <= loop["end_ns"].iloc[0])
               & (r["tid"] == loop["tid"].iloc[0])]
    assert (inside["depth"] > loop["depth"].iloc[0]).all()
    saxpy = read_nsys(NSYS / "saxpy_mpi_cuda_a100_nvtx_nsys2022.2.sqlite").ranges
    assert set(saxpy.loc[saxpy["name"] == "MPI_Send", "domain"]) == {"MPI"}
    assert set(saxpy.loc[saxpy["name"] == "saxpy", "domain"]) == {""}


@needs_real
def test_windowed_two_process_file():
    tl = read_nsys(NSYS / "fastvideo_train_2xH100_nccl_before_nsys2026.2_300ms-window.sqlite")
    assert tl.meta.has_warning(WarningCode.WINDOW_CUT)
    assert tl.meta.has_warning(WarningCode.MULTI_PROCESS)
    assert (tl.meta.window_start_ns, tl.meta.window_end_ns) == (60111418026, 60411418026)
    assert tl.meta.ranks == [0, 1]
    assert tl.meta.devices and not tl.meta.extra["nsys.gpus_on_host"]   # no TARGET_INFO_GPU
    # correlation ids repeat across the two processes: (pid, correlation) stays unique per launch
    launches = tl.api[tl.api["kind"] == "launch"]
    assert launches.duplicated(["pid", "correlation"]).sum() == 0
    assert launches["correlation"].duplicated().sum() > 0
    nccl = tl.device[tl.device["name"].astype(str).str.startswith("ncclDevKernel")]
    assert len(nccl) == 66
    assert set(tl.ranges["domain"].astype(str)) >= {"", "domain1"}     # lost domain-create rows


@needs_real
def test_nccl_before_after_pair_loads_as_comparable_timelines():
    before = load_timeline([NSYS / "fastvideo_train_2xH100_nccl_before_nsys2026.2_300ms-window.sqlite"])
    after = load_timeline([NSYS / "fastvideo_train_2xH100_nccl_after_nsys2026.2_300ms-window.sqlite"])
    for tl in (before, after):
        assert list(tl.device.columns) == list(after.device.columns)
        assert tl.meta.ranks == [0, 1]
        assert tl.meta.window_end_ns - tl.meta.window_start_ns == 300_000_000
    assert (len(before.device[before.device.kind == "kernel"]),
            len(after.device[after.device.kind == "kernel"])) == (4010, 3587)


@needs_real
def test_gpu_info_only_for_used_devices():
    tl = read_nsys(NSYS / "nvfuser_test_8xH100node_nvtx_nsys2024.6.sqlite")
    assert tl.meta.extra["nsys.gpus_on_host"] == 8
    assert [d.name for d in tl.meta.devices] == ["NVIDIA H100 80GB HBM3"]
    assert tl.meta.devices[0].sm_count == 132


@needs_real
def test_tiny_file_without_nvtx_warns():
    tl = read_nsys(NSYS / "pytorch_tiny_sum_rtx3080_nsys2026.1.sqlite")
    assert tl.meta.has_warning(WarningCode.NO_NVTX)
    assert Traced.NVTX not in tl.meta.traced and Traced.KERNELS in tl.meta.traced


@needs_real
def test_real_files_untouched_after_reading(tmp_path):
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in NSYS.iterdir()}
    listing = sorted(p.name for p in NSYS.iterdir())
    for p in sorted(NSYS.glob("*.sqlite")):
        read_nsys(p)
    assert sorted(p.name for p in NSYS.iterdir()) == listing      # no -journal / -wal / -shm
    assert {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in NSYS.iterdir()} == before
    for name, m in MANIFEST.items():
        assert before[NSYS / name] == m["sha256"]


def test_readonly_on_a_copy_in_a_writable_folder(tmp_path):
    path = tmp_path / "w.sqlite"
    with NsysWriter(path) as w:
        w.add_runtime([0], [5], ["cudaLaunchKernel_v7000"], pid=1, tid=2, correlation=[1])
        w.add_kernels([6], [9], ["k"], pid=1, correlation=[1])
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    read_nsys(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.sqlite"]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest


# -- files from the schema writer -------------------------------------------------------------

def _scenario(path: Path, **kw) -> Path:
    n = 100
    start = np.arange(n, dtype=np.int64) * 10_000 + 1_000_000
    corr = np.arange(1, n + 1)
    names = np.where(np.arange(n) % 2 == 0, "cudaLaunchKernel_v7000", "cuLaunchKernel")
    with NsysWriter(path, **kw) as w:
        w.add_gpu(0, "NVIDIA H200", sm_count=132)
        w.add_thread(100, 101, "scheduler")
        w.add_runtime(start, start + 2_000, names, pid=100, tid=101, correlation=corr)
        w.add_kernels(start + 3_000, start + 8_000, [f"gemm_{i % 7}" for i in range(n)],
                      device=0, stream=7, pid=100, correlation=corr)
        w.add_nvtx([start[0] - 100], [start[-1] + 9_000], ["loop.step step=1 mode=decode bs=8"],
                   pid=100, tid=101, domain="srtscope")
        w.add_nvtx(start[:10], start[:10] + 2_500, ["sched.schedule bs=8"] * 10, pid=100, tid=101,
                   domain="srtscope")
        w.add_nvtx([start[5]], [0], ["a mark"], pid=100, tid=101, event_type=34)
        w.add_nvtx([start[3]], [start[40]], ["async work"], pid=100, tid=101, event_type=60)
        w.add_nvtx([start[0]], [start[1]], ["registered"], pid=100, tid=102, registered=True)
        w.add_memcpy([start[-1] + 9_000], [start[-1] + 9_500], bytes=4096, copy_kind=2, pid=100,
                     correlation=[n + 1])
    return path


def test_writer_file_reads_back(tmp_path):
    tl = load_timeline([_scenario(tmp_path / "s.sqlite")])
    k = tl.device[tl.device.kind == "kernel"]
    assert len(k) == 100 and k["name"].nunique() == 7
    assert set(tl.device.loc[tl.device.kind == "memcpy", "name"]) == {"Memcpy DtoH"}
    assert set(tl.api["name"].astype(str)) == {"cudaLaunchKernel", "cuLaunchKernel"}
    assert set(tl.api["kind"].astype(str)) == {"launch"}
    assert set(tl.api["tid"]) == {101} and set(tl.api["pid"]) == {100}
    assert (tl.device.loc[tl.device.kind == "kernel", "correlation"].to_numpy()
            == np.arange(1, 101)).all()
    r = tl.ranges
    assert len(r) == 1 + 10 + 1 + 1                                   # the mark is excluded
    sched = r[r["name"] == "sched.schedule"]
    assert len(sched) == 10 and all(a == {"bs": "8"} for a in sched["attrs"])
    assert set(sched["domain"]) == {"srtscope"} and set(sched["depth"]) == {1}
    step = r[r["name"] == "loop.step"].iloc[0]
    assert step["attrs"] == {"step": "1", "mode": "decode", "bs": "8"} and step["depth"] == 0
    assert r.loc[r["name"] == "async work", "depth"].iloc[0] == -1        # start/end range
    assert "registered" in set(r["name"])                                 # textId -> StringIds
    assert tl.meta.extra["nsys.nvtx_marks"] == 1
    assert tl.meta.extra["nsys.thread_names"] == {"100:101": "scheduler"}
    assert tl.meta.devices[0].name == "NVIDIA H200"
    assert tl.meta.warnings == []


@pytest.mark.parametrize("version", ["2022.2.1", "2023.1.1", "2024.5.1", "2025.3.1", "2026.2.1"])
def test_writer_versions_read_back(tmp_path, version):
    tl = read_nsys(_scenario(tmp_path / "v.sqlite", version=version))
    assert len(tl.device[tl.device.kind == "kernel"]) == 100
    assert not tl.meta.has_warning(WarningCode.UNKNOWN_SCHEMA)
    table = "EXPORT_META_DATA" if version < "2024.5" else "META_DATA_EXPORT"
    assert tl.meta.extra["nsys.meta_table"] == table


def test_unknown_schema_version_warns(tmp_path):
    tl = read_nsys(_scenario(tmp_path / "u.sqlite", schema_version="9.0.0"))
    assert tl.meta.has_warning(WarningCode.UNKNOWN_SCHEMA)


def test_graph_mode_without_node_kernels_warns(tmp_path):
    path = tmp_path / "g.sqlite"
    with NsysWriter(path, version="2026.2.1") as w:
        w.add_capture_meta("CUDA_GRAPH_TRACE_OPTIONS:MODE", "Graph")
        w.add_runtime([0, 100], [10, 110], ["cudaGraphLaunch_v10000"] * 2, pid=7, tid=7,
                      correlation=[1, 2])
        w.add_graph_trace([20, 120], [90, 190], graph_id=[5, 5], pid=7, correlation=[1, 2])
    tl = read_nsys(path)
    assert tl.meta.has_warning(WarningCode.GRAPH_NOT_PER_NODE)
    assert set(tl.device["kind"]) == {DeviceKind.GRAPH.value}
    assert list(tl.device["graph_id"]) == [5, 5]
    assert tl.meta.extra["nsys.graph_trace_mode"] == "Graph"
    assert tl.meta.has_warning(WarningCode.NO_KERNELS)


def test_node_mode_kernels_carry_graph_ids(tmp_path):
    path = tmp_path / "n.sqlite"
    with NsysWriter(path, version="2026.2.1") as w:
        w.add_runtime([0], [10], ["cudaGraphLaunch_v10000"], pid=7, tid=7, correlation=[1])
        w.add_kernels([20, 40], [30, 50], ["a", "b"], pid=7, correlation=[1, 1], graph_id=3,
                      graph_node=[11, 12])
    tl = read_nsys(path)
    assert Traced.GRAPH_NODES in tl.meta.traced
    assert not tl.meta.has_warning(WarningCode.GRAPH_NOT_PER_NODE)
    assert list(tl.device["graph_id"]) == [3, 3] and list(tl.device["graph_node"]) == [11, 12]
    assert list(tl.api["kind"]) == ["graph_launch"]


def test_rank_from_file_name_and_order(tmp_path):
    a = _scenario(tmp_path / "trace_rank3.sqlite")
    b = _scenario(tmp_path / "other.sqlite")
    tl = load_timeline([a, b])
    assert tl.meta.ranks == [3, 4]
    assert set(tl.device["rank"]) == {3, 4}
    with pytest.raises(TraceError, match="same rank"):
        load_timeline([a, a])


def test_progress_reports_fractions(tmp_path):
    a = _scenario(tmp_path / "r0.sqlite")
    b = _scenario(tmp_path / "r1.sqlite")
    seen = []
    load_timeline([a, b], progress=lambda frac, what: seen.append((frac, what)))
    fracs = [f for f, _ in seen]
    # each file starts at its share, reports its scanned rows within that share, then "done"
    assert seen[0] == (0.0, "reading r0.sqlite") and seen[-1] == (1.0, "done")
    assert (0.5, "reading r1.sqlite") in seen
    assert fracs == sorted(fracs) and all(0.0 <= f <= 1.0 for f in fracs)
    within_first = [f for f, w in seen if w == "reading r0.sqlite" and 0.0 < f <= 0.5]
    assert within_first and within_first[-1] == pytest.approx(0.5)


def test_progress_within_one_big_file(tmp_path, monkeypatch):
    from srtscope.analyzers.readers import columnar

    monkeypatch.setattr(columnar, "BATCH_ROWS", 64)  # many batches from a small file
    a = _scenario(tmp_path / "r0.sqlite")
    seen = []
    load_timeline([a], progress=lambda frac, what: seen.append(frac))
    inner = [f for f in seen if 0.0 < f < 1.0]
    assert len(inner) >= 3 and inner == sorted(inner)


@needs_real
def test_api_only_helper_process_gets_no_rank_of_its_own():
    tl = read_nsys(NSYS / "nvfuser_crossentropy_bench_h200_nvtx_nsys2025.1.sqlite")
    assert set(tl.api["pid"]) == {50556, 50922}        # pytest + a python3 helper (2 API calls)
    assert set(tl.device["pid"]) == {50556}
    assert tl.meta.ranks == [0] and set(tl.api["rank"]) == {0}
    assert not tl.meta.has_warning(WarningCode.MULTI_PROCESS)
    assert tl.meta.extra["nsys.process_names"] == {50556: "pytest", 50922: "python3"}


@pytest.mark.parametrize("intervals,expected", [
    ([(0, 100), (10, 20), (30, 90), (40, 50)], [0, 1, 1, 2]),
    ([(0, 10), (0, 5), (5, 10)], [0, 1, 1]),                 # same start: the longer is outer
    ([(0, 10), (10, 20)], [0, 0]),                           # touching siblings
    ([(0, 10), (2, 4), (20, 30)], [0, 1, 0]),
])
def test_nesting_depth(intervals, expected):
    from srtscope.analyzers.readers.columnar import nesting_depth
    s = np.array([a for a, _ in intervals], np.int64)
    e = np.array([b for _, b in intervals], np.int64)
    # the same pattern on two threads, interleaved in time, gives the same depths
    thread = np.r_[np.zeros(len(s), np.int64), np.ones(len(s), np.int64)]
    depth = nesting_depth(np.r_[s, s + 3], np.r_[e, e + 3], thread, np.ones(2 * len(s), bool))
    assert list(depth) == expected * 2


def test_sparse_rowids_read_without_spinning(tmp_path):
    path = _scenario(tmp_path / "sparse.sqlite")
    con = sqlite3.connect(path)
    con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL SELECT * FROM CUPTI_ACTIVITY_KIND_KERNEL "
                "LIMIT 1")
    con.execute(f"UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET rowid = {2**62} "
                "WHERE rowid = (SELECT MAX(rowid) FROM CUPTI_ACTIVITY_KIND_KERNEL)")
    con.commit()
    con.close()
    tl = read_nsys(path)
    assert (tl.device["kind"] == "kernel").sum() == 101


def test_window_from_session_bounds_or_events(tmp_path):
    tl = read_nsys(_scenario(tmp_path / "w.sqlite"))
    assert (tl.meta.window_start_ns, tl.meta.window_end_ns) == tl.span_ns   # writer's bounds
    path = _scenario(tmp_path / "nobounds.sqlite")
    con = sqlite3.connect(path)
    con.execute("DROP TABLE ANALYSIS_DETAILS")
    con.commit()
    con.close()
    tl = read_nsys(path)
    assert (tl.meta.window_start_ns, tl.meta.window_end_ns) == tl.span_ns


def test_copy_names_carry_the_memory_kinds(tmp_path):
    """nsys ``srcKind``/``dstKind`` (0 pageable, 2 device): a pageable HtoD copy is named as Kineto
    names it, so the copy advice can tell pageable from pinned memory; unknown kinds add nothing."""
    from srtscope.analyzers.diagnose import diagnose

    path = _scenario(tmp_path / "s.sqlite")
    con = sqlite3.connect(path)
    con.execute("UPDATE CUPTI_ACTIVITY_KIND_MEMCPY SET copyKind = 1, srcKind = 0, dstKind = 2")
    con.commit()
    con.close()
    tl = load_timeline([path])
    assert set(tl.device.loc[tl.device.kind == "memcpy", "name"]) == {"Memcpy HtoD (Pageable -> Device)"}
    st = diagnose(tl).device.memcpy["HtoD"]
    assert st.pageable_ns == st.ns > 0
