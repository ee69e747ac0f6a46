"""``load_timeline(cluster=ADDRESS)`` / ``diagnose --cluster ADDRESS`` (issue 19): rank files read on a
Dask distributed cluster give the same Timeline and JSON as read here; every failure is one line.

One ``LocalCluster`` (2 worker processes) per module: starting it costs ~1-2 s."""
from __future__ import annotations

import gzip
import json
import os
import shutil
import socket
import sys
import time
from dataclasses import replace
from pathlib import Path

import pandas.testing as pdt
import pytest
from typer.testing import CliRunner

from sample_traces import generate as gen
from srtscope.analyzers.readers import TraceError, load_timeline
from srtscope.cli.app import app

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
PAIR = [SAMPLES / "comm_straggler.rank0.sqlite", SAMPLES / "comm_straggler.rank1.sqlite"]
try:
    import distributed
except ImportError:
    distributed = None
needs_distributed = pytest.mark.skipif(distributed is None, reason="Dask distributed not installed: "
                                       "pip install 'srtscope[cluster]' (it is in the test extra)")


@pytest.fixture(scope="module")
def workers_cache(tmp_path_factory) -> Path:
    """The workers' table cache (``SRTSCOPE_CACHE_DIR`` of the worker processes)."""
    return tmp_path_factory.mktemp("workers-cache")


@pytest.fixture(scope="module")
def cluster(workers_cache):
    """The address of a local 2-worker cluster, whose workers cache every file (min size 0)."""
    if distributed is None:
        pytest.skip("Dask distributed not installed: pip install 'srtscope[cluster]'")
    env = {"SRTSCOPE_CACHE_DIR": str(workers_cache), "SRTSCOPE_CACHE_MIN_BYTES": "0"}
    with pytest.MonkeyPatch.context() as mp:
        # NOTE: set here as well as passed: worker processes inherit this process's environment
        for k, v in env.items():
            mp.setenv(k, v)
        with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                      dashboard_address=None, env=env) as lc:
            yield lc.scheduler_address


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory) -> list[Path]:
    """Four small rank exports of one simulated job (rank 3 the straggler)."""
    base = gen.RankSpec(comm_transfer_us=30)
    sc = gen.Scenario("four", "kernel", "communication-bound", 12,
                      (base, base, base, replace(base, kernel_us=90)))
    return gen.write(sc, tmp_path_factory.mktemp("four"))


def _same(a, b) -> None:
    for t in ("device", "api", "ranges", "counters"):
        pdt.assert_frame_equal(getattr(a, t), getattr(b, t))
    assert a.meta == b.meta


def _cli(*args: str | Path, env: dict[str, str] | None = None):
    return CliRunner().invoke(app, [str(a) for a in args], env=env)


def _one_error_line(r, *needles: str) -> str:
    assert r.exit_code == 2, (r.exit_code, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("srtscope: error: "), r.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


@needs_distributed
def test_the_same_timeline(cluster, four_ranks):
    _same(load_timeline(four_ranks), load_timeline(four_ranks, cluster=cluster))
    _same(load_timeline(PAIR[:1]), load_timeline(PAIR[:1], cluster=cluster))     # one file too


@needs_distributed
def test_unnamed_files_get_the_same_ranks(cluster, tmp_path):
    files = []
    for i, src in enumerate(PAIR):
        files.append(tmp_path / f"part{'ab'[i]}.sqlite")
        shutil.copyfile(src, files[-1])
    seq, clu = load_timeline(files), load_timeline(files, cluster=cluster)
    _same(seq, clu)
    assert clu.meta.ranks == [0, 1]


@needs_distributed
def test_a_wrong_rank_guess_is_read_again(cluster, tmp_path):
    """``a`` says rank 1 inside, so unnamed ``b`` is rank 2, not its position 1: read again, on the cluster."""
    doc = json.loads(gzip.decompress((SAMPLES / "profiler_steps.json.gz").read_bytes()))
    (tmp_path / "b.json").write_text(json.dumps(doc))
    doc["distributedInfo"] = {"rank": 1, "world_size": 3}
    (tmp_path / "a.json").write_text(json.dumps(doc))
    files = [tmp_path / "a.json", tmp_path / "b.json"]
    seq, clu = load_timeline(files), load_timeline(files, cluster=cluster)
    _same(seq, clu)
    assert clu.meta.ranks == [1, 2]


@needs_distributed
def test_progress_reaches_one(cluster):
    seen: list[float] = []
    load_timeline(PAIR, progress=lambda f, what: seen.append(f), cluster=cluster)
    assert seen and seen[-1] == 1.0 and seen == sorted(seen)


@needs_distributed
def test_diagnose_and_compare_json_identical(cluster, four_ranks):
    def run(*args: str | Path) -> dict:
        r = _cli(*args)
        assert r.exit_code == 0, (r.stdout, r.stderr)
        return json.loads(r.stdout)

    seq = run("diagnose", "--json", "--no-cache", *four_ranks)
    assert seq == run("diagnose", "--json", "--no-cache", "--cluster", cluster, *four_ranks)
    assert seq == run("diagnose", "--json", "--cluster", cluster, *four_ranks)
    before, after = ",".join(map(str, PAIR)), ",".join(map(str, four_ranks))
    assert run("compare", "--json", before, after) == run("compare", "--json", "--cluster", cluster, before, after)


@needs_distributed
def test_the_cache_is_the_workers(cluster, workers_cache, tmp_path):
    """``cache=True`` fills the cache of the workers that read, not this process's."""
    files = [tmp_path / p.name for p in PAIR]
    for src, dst in zip(PAIR, files):
        shutil.copyfile(src, dst)
    ours = Path(os.environ["SRTSCOPE_CACHE_DIR"])
    before = set(workers_cache.rglob("meta.json"))
    first = load_timeline(files, cache=True, cluster=cluster)
    filled = set(workers_cache.rglob("meta.json")) - before
    assert len(filled) == 2
    assert not list(ours.rglob("meta.json"))
    _same(first, load_timeline(files, cache=True, cluster=cluster))       # hits give the same
    _same(first, load_timeline(files))


@needs_distributed
def test_a_file_the_workers_cannot_see(cluster, tmp_path):
    missing = tmp_path / "elsewhere" / "rank1.sqlite"
    line = _one_error_line(_cli("diagnose", "--json", "--cluster", cluster, PAIR[0], missing),
                           str(missing), "no such file on Dask worker tcp://", "shared filesystem")
    assert "Traceback" not in line


@needs_distributed
def test_a_bad_file_fails_as_it_does_here(cluster, tmp_path):
    bad = tmp_path / "rank1.sqlite"
    bad.write_bytes(b"SQLite format 3\x00" + b"\x00" * 200)
    with pytest.raises(TraceError) as here:
        load_timeline([PAIR[0], bad])
    with pytest.raises(TraceError) as there:
        load_timeline([PAIR[0], bad], cluster=cluster)
    assert str(here.value) == str(there.value)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@needs_distributed
@pytest.mark.parametrize("address, needle", [
    (f"tcp://127.0.0.1:{_closed_port()}", "cannot reach a Dask scheduler within 1 s"),
    ("no-port-here", "not a Dask scheduler address"),
    ("foo://host:1", "not a Dask scheduler address"),
    ("", "empty scheduler address"),
])
def test_a_bad_address_is_one_line_and_bounded(address, needle):
    t0 = time.monotonic()
    _one_error_line(_cli("diagnose", "--json", "--cluster", address, *PAIR, env={"SRTSCOPE_CLUSTER_TIMEOUT": "1"}),
                    needle)
    assert time.monotonic() - t0 < 8


def test_without_the_extra_one_line_says_how(monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)     # `import distributed` -> ImportError
    _one_error_line(_cli("diagnose", "--json", "--cluster", "tcp://127.0.0.1:8786", *PAIR),
                    "pip install 'srtscope[cluster]'")


def test_not_with_jobs():
    _one_error_line(_cli("diagnose", "--cluster", "tcp://127.0.0.1:8786", "--jobs", "2", *PAIR),
                    "--cluster and --jobs 2")
    _one_error_line(_cli("compare", "--cluster", "tcp://127.0.0.1:8786", "--jobs", "2", PAIR[0], PAIR[1]),
                    "--cluster and --jobs 2")
    with pytest.raises(ValueError):
        load_timeline(PAIR, jobs=2, cluster="tcp://127.0.0.1:8786")


def test_a_bad_timeout_setting(monkeypatch):
    monkeypatch.setenv("SRTSCOPE_CLUSTER_TIMEOUT", "soon")
    if distributed is None:
        pytest.skip("Dask distributed not installed")
    _one_error_line(_cli("diagnose", "--cluster", "tcp://127.0.0.1:8786", *PAIR), "SRTSCOPE_CLUSTER_TIMEOUT")


def test_the_cli_does_not_import_distributed_without_cluster():
    """The extra is imported only for ``--cluster`` (it costs ~0.4 s)."""
    import subprocess

    code = ("import sys; from typer.testing import CliRunner; from srtscope.cli.app import app; "
            f"r = CliRunner().invoke(app, ['diagnose', '--json', {str(PAIR[0])!r}]); "
            "assert r.exit_code == 0, r.output; print('distributed' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


@needs_distributed
def test_a_fifo_given_to_a_worker_is_refused_and_the_worker_serves_on(cluster, tmp_path):
    """A FIFO path must not hang the worker that opens it, nor every later request to it."""
    fifo = tmp_path / "rank1.sqlite"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    with pytest.raises(TraceError, match="is not a regular file on Dask worker"):
        load_timeline([PAIR[0], fifo], cluster=cluster)
    assert time.monotonic() - t0 < 30
    _same(load_timeline(PAIR), load_timeline(PAIR, cluster=cluster))      # both workers still serve


@needs_distributed
@pytest.mark.parametrize("command", ["diagnose", "compare"])
def test_a_listener_that_never_answers_is_bounded_by_the_timeout(silent_listener, command):
    files = [*PAIR] if command == "diagnose" else [PAIR[0], PAIR[1]]
    t0 = time.monotonic()
    _one_error_line(_cli(command, "--cluster", f"tcp://{silent_listener}", *files,
                         env={"SRTSCOPE_CLUSTER_TIMEOUT": "0.5"}),
                    "accepted the connection but said nothing within 0.5 s")
    assert time.monotonic() - t0 < 6           # imports ~1 s, then 0.5 s; it ran past 500 s before


@needs_distributed
@pytest.mark.parametrize("port", ["99999", "0", "65536", "-5"])
def test_a_port_out_of_range_is_refused_at_once(port):
    t0 = time.monotonic()
    _one_error_line(_cli("diagnose", "--cluster", f"tcp://127.0.0.1:{port}", *PAIR), "outside 1..65535")
    assert time.monotonic() - t0 < 4           # no 10 s wait for a connection that cannot be


@needs_distributed
def test_a_scheduler_that_stops_answering_mid_read_is_bounded(tmp_path):
    """Connected, then the scheduler freezes (SIGSTOP): the reads give up within a few T with one
    ClusterError instead of waiting for ever."""
    import signal
    import subprocess

    from srtscope.analyzers.readers.cluster import ClusterError, connect

    port = _closed_port()
    # NOTE: their scratch folders in tmp_path: killed, they leave them behind
    env = dict(os.environ, DASK_DISTRIBUTED__WORKER__DAEMON="False", DASK_TEMPORARY_DIRECTORY=str(tmp_path))
    dask = Path(sys.executable).with_name("dask")
    sched = subprocess.Popen([str(dask), "scheduler", "--host", "127.0.0.1", "--port", str(port),
                              "--dashboard-address", ":0", "--no-show"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    worker = subprocess.Popen([str(dask), "worker", f"tcp://127.0.0.1:{port}", "--nworkers", "1",
                               "--nthreads", "1", "--no-dashboard"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with connect(f"tcp://127.0.0.1:{port}", timeout_s=20) as reads:
            reads.timeout_s = 1.0
            sched.send_signal(signal.SIGSTOP)
            t0 = time.monotonic()
            with pytest.raises(ClusterError, match="the scheduler stopped answering"):
                reads.read(PAIR, [0, 1], False, False)
            assert time.monotonic() - t0 < 5          # T to notice, T for the ping, T to cancel
    finally:
        sched.send_signal(signal.SIGCONT)
        for p in (worker, sched):
            p.kill()
            p.wait()
