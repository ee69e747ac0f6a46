"""``diagnose --cluster`` never waits for ever and never prints more than its one line (issue 47): a
worker killed or stopped mid-read, a read past ``$SRTSCOPE_CLUSTER_READ_TIMEOUT`` and a ``tls://``
listener that never answers each end in exit 2 with one stderr line, within a loose deadline, with
nothing left running on the scheduler.

The reads of the real-cluster cases are made slow by a worker preload (a test file written here)
that wraps ``read_one`` in a 600 s sleep and marks the read's start in a file: a hang runs past the
CLI helper's timeout instead of passing."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from srtscope.analyzers.readers.cluster import ClusterError, ClusterReads
from srtscope.analyzers.readers.cluster_watch import ReadWatch, silence_s
from tests.analyzers._cli import srtscope

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "comm_straggler.rank0.sqlite"
try:
    import distributed
except ImportError:
    distributed = None
needs_distributed = pytest.mark.skipif(distributed is None, reason="Dask distributed not installed: "
                                       "pip install 'srtscope[cluster]' (it is in the test extra)")
#: a deadline the fixed code keeps with room to spare (it answers in ~2-6 s at T = 1) and a hang
#: cannot: the read sleeps 600 s
DEADLINE_S = 45
SLOW_READ = '''"""srtscope test preload: read_one sleeps $SLOW_READ_S first and marks its start in $SLOW_READ_MARK."""
import os, pathlib, time
import srtscope.analyzers.readers as readers
_read = getattr(readers.read_one, "__wrapped__", readers.read_one)    # a reloaded preload wraps once
def slow(*args, **kwargs):
    pathlib.Path(os.environ["SLOW_READ_MARK"]).write_text(str(os.getpid()))
    time.sleep(float(os.environ["SLOW_READ_S"]))
    return _read(*args, **kwargs)
slow.__wrapped__ = _read
readers.read_one = slow
'''


# ---- the checks on their own: a scripted scheduler, a clock of our own ----

class FakeScheduler:
    def __init__(self) -> None:
        self.workers: dict[str, dict] = {"tcp://w:1": {"last_seen": 0.0}}
        self.running: dict[str, list[str]] = {"tcp://w:1": ["k"]}
        self.answers = True

    def identity(self) -> dict:
        return {"workers": self.workers}

    def processing(self) -> dict:
        return self.running


class FakeClient:
    def __init__(self) -> None:
        self.scheduler = FakeScheduler()

    def sync(self, rpc, callback_timeout: float, **kwargs):
        if not self.scheduler.answers:
            raise TimeoutError(f"timed out after {callback_timeout} s")
        return rpc(**kwargs)


def _watch(read_timeout_s: float = 3600.0) -> tuple[FakeClient, ReadWatch, list[float]]:
    client, now = FakeClient(), [0.0]
    watch = ReadWatch(client, "tcp://s:1", {"k": Path("rank0.sqlite")}, 1.0, read_timeout_s, ClusterError,
                      clock=lambda: now[0])
    return client, watch, now


def test_a_worker_heard_from_may_read_for_as_long_as_the_read_timeout():
    client, watch, now = _watch(read_timeout_s=100)
    for t in range(100):
        now[0] = t
        client.scheduler.workers["tcp://w:1"]["last_seen"] = t       # heartbeats arrive
        watch.check({"k"})
    now[0] = 101
    with pytest.raises(ClusterError, match="rank0.sqlite: its read on Dask worker tcp://w:1 ran past 100 s"):
        watch.check({"k"})


def test_a_worker_not_heard_from_is_given_up():
    client, watch, now = _watch()
    quiet = silence_s(1.0, 1)
    watch.check({"k"})
    now[0] = quiet - 0.01
    watch.check({"k"})                                  # not yet
    now[0] = quiet
    with pytest.raises(ClusterError, match="Dask worker tcp://w:1 reading it has not been heard from"):
        watch.check({"k"})


def test_no_worker_left_is_given_up_after_t_and_a_returning_one_is_waited_for():
    client, watch, now = _watch()
    client.scheduler.workers, client.scheduler.running = {}, {}
    watch.check({"k"})
    now[0] = 0.9
    watch.check({"k"})
    client.scheduler.workers = {"tcp://w:2": {"last_seen": 1.0}}      # a nanny's restart, say
    now[0] = 1.5
    watch.check({"k"})
    client.scheduler.workers = {}
    now[0] = 2.0
    watch.check({"k"})
    now[0] = 3.0
    with pytest.raises(ClusterError, match="no Dask worker left"):
        watch.check({"k"})


def test_a_scheduler_that_does_not_answer_is_given_up():
    client, watch, _ = _watch()
    client.scheduler.answers = False
    with pytest.raises(ClusterError, match="the scheduler stopped answering"):
        watch.check({"k"})


def test_reads_are_checked_on_a_clock_even_while_others_finish():
    """One read that never finishes among reads that keep finishing is still checked every T."""
    class Fut:
        def __init__(self, key: str, after: float | None) -> None:
            self.key, self.after = key, after

        def add_done_callback(self, fn) -> None:
            if self.after is not None:
                threading.Timer(self.after, fn, args=(self,)).start()

    class Watch:
        pending: list[set] = []

        def check(self, pending) -> None:
            self.pending.append(set(pending))
            if self.pending[-1] == {"stuck"}:
                raise ClusterError("given up")

    futs = [Fut(str(i), 0.05 * i) for i in range(1, 8)] + [Fut("stuck", None)]
    watch = Watch()
    seen = []
    with pytest.raises(ClusterError, match="given up"):
        for fut in ClusterReads(None, "tcp://x:1", timeout_s=0.1)._finished(futs, watch):  # type: ignore[arg-type]
            seen.append(fut.key)
    assert seen == [str(i) for i in range(1, 8)]
    assert len(watch.pending[0]) > 1            # checked while reads finished every 0.05 s < T


# ---- a real scheduler and worker, the CLI in a process of its own ----

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def slow_cluster(tmp_path, monkeypatch):
    """``(scheduler address, worker process, marker file)``: a ``dask scheduler`` and one ``dask worker``
    (no nanny: a killed worker stays dead) whose reads sleep 600 s after writing the marker.
    Both processes are ended and reaped afterwards (SIGKILL ends a stopped one too)."""
    if distributed is None:
        pytest.skip("Dask distributed not installed")
    preload = tmp_path / "slow_read_preload.py"
    preload.write_text(SLOW_READ)
    mark = tmp_path / "read-started"
    address = f"tcp://127.0.0.1:{_free_port()}"
    # NOTE: DASK_TEMPORARY_DIRECTORY: the scheduler's scratch folder in tmp_path, not /tmp
    env = dict(os.environ, SLOW_READ_S="600", SLOW_READ_MARK=str(mark), DASK_TEMPORARY_DIRECTORY=str(tmp_path),
               DASK_DISTRIBUTED__WORKER__DAEMON="False")
    dask = str(Path(sys.executable).with_name("dask"))
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "env": env}
    procs = [subprocess.Popen([dask, "scheduler", "--host", "127.0.0.1", "--port", address.rsplit(":", 1)[1],
                               "--dashboard-address", ":0", "--no-show"], **quiet),
             subprocess.Popen([dask, "worker", address, "--nthreads", "1", "--no-nanny", "--no-dashboard",
                               "--local-directory", str(tmp_path / "worker"), "--preload", str(preload)],
                              **quiet)]
    try:
        with distributed.Client(address, timeout=60, set_as_default=False) as c:
            c.wait_for_workers(1, timeout=60)
        monkeypatch.setenv("SRTSCOPE_CLUSTER_TIMEOUT", "1")
        yield address, procs[1], mark
    finally:
        procs[1].kill()             # its read sleeps: it would not end on SIGTERM
        procs[0].terminate()        # the scheduler removes its scratch folder
        for p in reversed(procs):
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _when_reading(mark: Path, act) -> threading.Thread:
    """``act()`` on a thread once the worker's read has begun (``mark`` written), within 60 s."""
    def wait() -> None:
        t0 = time.monotonic()
        while not mark.exists() and time.monotonic() - t0 < 60:
            time.sleep(0.05)
        if mark.exists():
            act()

    th = threading.Thread(target=wait, daemon=True)
    th.start()
    return th


def _scheduler_tasks(address: str) -> int:
    """The tasks the scheduler still holds, after up to 10 s for it to forget a departed client's."""
    with distributed.Client(address, timeout=30, set_as_default=False) as c:
        for _ in range(100):
            n = c.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks))
            if n == 0:
                break
            time.sleep(0.1)
    return n


@needs_distributed
@pytest.mark.parametrize("sig, needle", [(signal.SIGKILL, "no Dask worker left"),
                                         (signal.SIGSTOP, "reading it has not been heard from")])
def test_a_worker_killed_or_stopped_mid_read_is_one_line_and_exit_2(slow_cluster, sig, needle):
    address, worker, mark = slow_cluster
    acted = _when_reading(mark, lambda: worker.send_signal(sig))
    t0 = time.monotonic()
    r = srtscope("diagnose", "--json", "--no-cache", "--cluster", address, SAMPLE, timeout=DEADLINE_S)
    r.error_line(needle, "the reads were given up")
    assert time.monotonic() - t0 < DEADLINE_S
    acted.join(1)
    assert mark.exists() and not acted.is_alive()      # it was mid-read
    assert _scheduler_tasks(address) == 0               # the read was cancelled, the client gone


@needs_distributed
def test_a_read_past_the_read_timeout_is_one_line_and_exit_2(slow_cluster, monkeypatch):
    address, _, mark = slow_cluster
    monkeypatch.setenv("SRTSCOPE_CLUSTER_READ_TIMEOUT", "2")
    r = srtscope("diagnose", "--json", "--no-cache", "--cluster", address, SAMPLE, timeout=DEADLINE_S)
    r.error_line("ran past 2 s ($SRTSCOPE_CLUSTER_READ_TIMEOUT)")
    assert mark.exists()
    assert _scheduler_tasks(address) == 0


@pytest.mark.parametrize("value", ["0", "soon", "1e9"])
def test_a_bad_read_timeout_setting_is_refused_before_connecting(monkeypatch, value):
    if distributed is None:
        pytest.skip("Dask distributed not installed")
    monkeypatch.setenv("SRTSCOPE_CLUSTER_READ_TIMEOUT", value)
    t0 = time.monotonic()
    srtscope("diagnose", "--cluster", f"tcp://127.0.0.1:{_free_port()}", SAMPLE).error_line(
        "SRTSCOPE_CLUSTER_READ_TIMEOUT")
    assert time.monotonic() - t0 < 30            # not the 10 s wait for a scheduler first


def _tls_settings(folder: Path) -> dict[str, str]:
    """Dask's TLS settings (environment) with a fresh self-signed certificate made by ``openssl``."""
    key, cert = folder / "key.pem", folder / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
                    "-out", str(cert), "-days", "1", "-subj", "/CN=localhost"], check=True,
                   capture_output=True, timeout=60)
    return {"DASK_DISTRIBUTED__COMM__TLS__CA_FILE": str(cert), "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT": str(cert),
            "DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY": str(key)}


@needs_distributed
@pytest.mark.parametrize("configured", [False, True], ids=["no-tls-settings", "tls-settings"])
def test_a_tls_listener_that_never_answers_is_exactly_one_line(silent_listener, configured, tmp_path, monkeypatch):
    """The audit's case: the right line, then a 9-line traceback from ``Client.__del__`` at exit."""
    if configured:
        if shutil.which("openssl") is None:
            pytest.skip("openssl not installed: no certificate to configure")
        for k, v in _tls_settings(tmp_path).items():
            monkeypatch.setenv(k, v)
    monkeypatch.setenv("SRTSCOPE_CLUSTER_TIMEOUT", "1")
    t0 = time.monotonic()
    r = srtscope("diagnose", "--json", "--cluster", f"tls://{silent_listener}", SAMPLE, timeout=DEADLINE_S)
    line = r.error_line(f"--cluster tls://{silent_listener}: ")
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert ("within 1 s" in line) if configured else ("distributed.comm.tls.ca-file" in line)
    assert time.monotonic() - t0 < DEADLINE_S
