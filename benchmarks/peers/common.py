"""Shared plumbing of the peer comparisons: where things are, how one run is measured, tables.

Every tool runs as its own subprocess; wall time is measured around it and peak memory is the child's
own maximum resident set size from ``os.wait4`` (which also covers descendants it waited for, e.g. a
multiprocessing pool). Nothing here imports srtscope or a peer.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PEERS = ROOT / "benchmarks" / "peers"
PEER_VENV = ROOT / "benchmarks" / ".peer-venv"
PEER_PY = PEER_VENV / "bin" / "python"
PROJECT_PY = ROOT / ".venv" / "bin" / "python"
CACHE = Path(os.environ.get("SRTSCOPE_BENCH_CACHE", "/tmp/srtscope-bench"))


def cores() -> str:
    n = os.cpu_count()
    try:
        avail = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        avail = n
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"{n} cores ({avail} usable), load average {load:.2f}"


def banner(title: str) -> None:
    print(f"# {title}")
    now = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"# machine: {cores()}; python {sys.version.split()[0]}; {now}")


# ---------------------------------------------------------------- peers


def peer_status() -> dict[str, str]:
    """What setup_peers.sh recorded (installed / failed / unavailable), or 'not set up'."""
    f = PEER_VENV / "peer_status.json"
    if not PEER_PY.exists() or not f.exists():
        return {"nsys-ai": "not set up (run benchmarks/peers/setup_peers.sh)",
                "hta": "not set up (run benchmarks/peers/setup_peers.sh)",
                "nsys-recipes": "unavailable (nsys binary not installed)"}
    return json.loads(f.read_text())


def peer_ok(name: str) -> bool:
    return peer_status().get(name, "").startswith("ok")


def ensure_peers(setup: bool) -> dict[str, str]:
    """Run setup_peers.sh when asked (or when the venv is missing and ``setup``), then report status."""
    if setup or not PEER_PY.exists():
        if setup:
            subprocess.run(["bash", str(PEERS / "setup_peers.sh")], check=False)
    return peer_status()


def start(title: str, setup: bool, peers: tuple[str, ...] | None = None) -> dict[str, str]:
    """The preamble of every comparison: banner, peers set up if asked, the srtscope driver and the
    status of ``peers`` (all when None) printed; returns every peer's status."""
    banner(title)
    status = ensure_peers(setup)
    print(f"# srtscope driver: {srtscope_mode()}")
    for k in (peers if peers is not None else tuple(status)):
        print(f"# peer {k}: {status.get(k)}")
    return status


def peer_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment of a peer driver: nsys-ai's DuckDB finds its sqlite_scanner in the venv's private HOME."""
    env = dict(os.environ)
    env["HOME"] = str(PEER_VENV / "home")
    env.pop("PYTHONPATH", None)
    env.update(extra or {})
    return env


# ---------------------------------------------------------------- srtscope


_SRTSCOPE_MODE: str | None = None


def srtscope_mode() -> str:
    """'cli' when `srtscope diagnose --json` works, else 'inproc' (benchmarks/peers/run_srtscope.py).

    Force with SRTSCOPE_BENCH_DRIVER=cli|inproc.
    """
    global _SRTSCOPE_MODE
    if _SRTSCOPE_MODE is None:
        forced = os.environ.get("SRTSCOPE_BENCH_DRIVER")
        if forced in ("cli", "inproc"):
            _SRTSCOPE_MODE = forced
        else:
            exe = ROOT / ".venv" / "bin" / "srtscope"
            ok = exe.exists() and subprocess.run([str(exe), "diagnose", "--help"], capture_output=True,
                                                 text=True, cwd=ROOT).returncode == 0
            _SRTSCOPE_MODE = "cli" if ok else "inproc"
    return _SRTSCOPE_MODE


def srtscope_command(paths: list[str | Path], threshold_us: float | None = None, cache: bool = False) -> list[str]:
    """The one place that says how srtscope is run (CLI once it exists, in-process driver before).
    A first look unless ``cache``: ``--no-cache``, so no run is answered from an earlier one's cache."""
    thr = [] if threshold_us is None else ["--threshold-us", f"{threshold_us:g}"]
    if srtscope_mode() == "cli":
        return [str(ROOT / ".venv" / "bin" / "srtscope"), "diagnose", *map(str, paths), "--json", *thr,
                *([] if cache else ["--no-cache"])]
    return [str(PROJECT_PY), str(PEERS / "run_srtscope.py"), *map(str, paths), *thr]


# ---------------------------------------------------------------- measuring


#: the SQLite floor: the sqlite3 shell selecting just the columns srtscope's nsys reader reads
#: (nsys_sqlite.py), per table (single-threaded; the least any SQLite reader pays); ``floor_command``.
FLOOR_SQL = """
SELECT start, end, deviceId, streamId, correlationId, globalPid, demangledName, graphNodeId
  FROM CUPTI_ACTIVITY_KIND_KERNEL;
SELECT start, end, deviceId, streamId, correlationId, globalPid, copyKind, bytes, graphNodeId
  FROM CUPTI_ACTIVITY_KIND_MEMCPY;
SELECT start, end, globalTid, correlationId, nameId FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE eventClass IN (0, 1);
SELECT n.start, n.end, n.eventType, n.globalTid, n.domainId, COALESCE(n.text, s.value) FROM NVTX_EVENTS n
  LEFT JOIN StringIds s ON s.id = n.textId WHERE n.end IS NOT NULL;
"""


def floor_command(path: str | Path) -> list[str]:
    """The sqlite3 shell running ``FLOOR_SQL`` on ``path``, its rows into /dev/null."""
    return ["sqlite3", "-cmd", ".output /dev/null", str(path), FLOOR_SQL]


@dataclass
class Run:
    wall_s: float
    maxrss_mb: float
    rc: int
    cpu_s: float          # user + system CPU of the child (and descendants it waited for)
    out: dict | None
    stderr: str = ""
    sys_s: float = 0.0    # the system part of cpu_s (paging, allocation, I/O)

    @property
    def ok(self) -> bool:
        return self.rc == 0 and self.out is not None


def _tree_rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` and every process below it, summed (MiB; pages two processes
    share after a fork count twice: an upper bound). 0 where /proc says nothing."""
    total, todo, page = 0, [pid], os.sysconf("SC_PAGE_SIZE")
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * page
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except (OSError, ValueError):
            continue
    return total / 2**20


def run_wait4(cmd: list[str], env: dict[str, str] | None = None, timeout: float = 1800) -> Run:
    """Run one command; wall time, peak RSS (MiB: the child's own via wait4, or where it forks, the
    peak of its process tree's summed RSS sampled every 20 ms, whichever is larger) and its JSON stdout."""
    import tempfile
    with tempfile.TemporaryFile("w+") as fo, tempfile.TemporaryFile("w+") as fe:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=fo, stderr=fe, env=env, cwd=ROOT, text=True)
        deadline = t0 + timeout
        tree, polls = 0.0, 0
        while True:
            pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            polls += 1
            if polls % 4 == 0:
                tree = max(tree, _tree_rss_mb(proc.pid))
            if time.perf_counter() > deadline:
                proc.kill()
                pid, status, ru = os.wait4(proc.pid, 0)
                break
            time.sleep(0.005)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        fo.seek(0), fe.seek(0)
        out, err = fo.read(), fe.read()
    parsed = None
    for line in reversed(out.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                parsed = json.loads(line)
                break
            except json.JSONDecodeError:
                continue
    if parsed is None and out.strip().startswith("{"):
        try:
            parsed = json.loads(out)
        except json.JSONDecodeError:
            pass
    return Run(wall, max(ru.ru_maxrss / 1024.0, tree), proc.returncode, ru.ru_utime + ru.ru_stime, parsed,
               err[-2000:], ru.ru_stime)


@dataclass
class Series:
    """Several runs of one tool on one input."""
    runs: list[Run] = field(default_factory=list)

    @property
    def ok_runs(self) -> list[Run]:
        return [r for r in self.runs if r.ok]

    @property
    def wall(self) -> float | None:
        ok = self.ok_runs
        return statistics.median(r.wall_s for r in ok) if ok else None

    @property
    def rss(self) -> float | None:
        ok = self.ok_runs
        return statistics.median(r.maxrss_mb for r in ok) if ok else None

    @property
    def cpu(self) -> float | None:
        ok = self.ok_runs
        return statistics.median(r.cpu_s for r in ok) if ok else None

    @property
    def out(self) -> dict | None:
        ok = self.ok_runs
        return ok[-1].out if ok else None

    def failure(self) -> str:
        bad = [r for r in self.runs if not r.ok]
        if not bad:
            return ""
        r = bad[-1]
        tail = (r.stderr.strip().splitlines() or ["(no stderr)"])[-1]
        return f"rc={r.rc}: {tail[:160]}"


def repeat(cmd: list[str], n: int, env: dict[str, str] | None = None, before=None,
           timeout: float = 1800) -> Series:
    s = Series()
    for _ in range(n):
        if before:
            before()
        s.runs.append(run_wait4(cmd, env=env, timeout=timeout))
        if not s.runs[-1].ok:
            break
    return s


# ---------------------------------------------------------------- formatting


def fmt_s(x: float | None) -> str:
    return "—" if x is None else (f"{x:.2f} s" if x < 100 else f"{x:.0f} s")


def fmt_mb(x: float | None) -> str:
    return "—" if x is None else f"{x:.0f} MiB"


def fmt_ms(ns: float | None) -> str:
    return "—" if ns is None else f"{ns / 1e6:.2f} ms"


def ratio(a: float | None, b: float | None) -> str:
    return "—" if not a or not b else f"{b / a:.2f}x"


def pct_diff(a: float | None, b: float | None) -> float | None:
    """|a-b| relative to the larger, in %."""
    if a is None or b is None:
        return None
    m = max(abs(a), abs(b))
    return 0.0 if m == 0 else 100.0 * abs(a - b) / m


def table(headers: list[str], rows: list[list[str]]) -> str:
    """A GitHub-markdown table (readable in a terminal too)."""
    w = [max(len(str(h)), *(len(str(r[i])) for r in rows)) if rows else len(str(h)) for i, h in enumerate(headers)]
    line = lambda cells: "| " + " | ".join(str(c).ljust(w[i]) for i, c in enumerate(cells)) + " |"  # noqa: E731
    return "\n".join([line(headers), "|" + "|".join("-" * (x + 2) for x in w) + "|", *map(line, rows)])


def save_results(name: str, payload: dict) -> Path:
    """Machine-readable results under the cache dir (never in the repo)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    p = CACHE / f"{name}.json"
    p.write_text(json.dumps(payload, indent=1, default=str))
    return p


def rm_tree(p: Path) -> None:
    shutil.rmtree(p, ignore_errors=True)
