"""Rank files read on a Dask distributed cluster (``load_timeline(cluster=ADDRESS)``, ``--cluster``).

    with connect("tcp://scheduler:8786") as reads:
        parts = reads.read(files, hints, allow_no_kernels=False, cache=True)

The same per-file map as ``--jobs``: each file is read by ``read_one(path, hint, ...)`` in one task on
some worker and the Timelines come back (pickled) to be merged here, exactly as a local read merges
them, so the result is the same. Needs the optional extra ``srtscope[cluster]`` (``distributed``),
imported only here and only when a cluster is asked for (it costs ~0.4 s of imports).

Workers read the files by path: they must see the paths given here (a shared filesystem) and have the
same srtscope installed; a worker that cannot read a file fails the load with one line naming the file
and the worker. ``cache``: the table cache is the one of the worker that reads the file (its
``$SRTSCOPE_CACHE_DIR`` or home), not this machine's.

Every failure is one line: ``TraceError`` for a file (as a local read would say, or that a worker
cannot open it or finds no regular file there), ``ClusterError`` for the cluster (extra missing,
a port outside 1..65535, scheduler unreachable, no workers, workers dying, the scheduler no longer
answering).

Deadlines: every wait on the network is bounded by ``$SRTSCOPE_CLUSTER_TIMEOUT`` seconds (``T``,
default 10): reaching the scheduler (a TCP connection, then for ``tcp://`` its greeting: a listener
that accepts and says nothing is refused), the client's start (``2 T``), the first worker, and while
the reads run a check every ``T`` (``cluster_watch.py``): the scheduler must answer within ``T``, a
worker must be left (for ``T`` with none the reads are given up), the worker running a read must be
heard from (a stopped or hung one is given up), and no read may run on a worker for more than
``$SRTSCOPE_CLUSTER_READ_TIMEOUT`` seconds (``R``, default 3600). A finished read's result must
arrive within ``R``. On any failure the reads left are cancelled and the client closed, each
bounded by ``T``; nothing of distributed's (log lines, a client's ``__del__``) reaches stderr.
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from srtscope.analyzers.model.timeline import Timeline
from srtscope.analyzers.readers.cluster_watch import ReadWatch
from srtscope.analyzers.readers.errors import TraceError

__all__ = ["ClusterError", "ClusterReads", "connect", "connect_timeout_s", "read_timeout_s"]

INSTALL_HINT = "pip install 'srtscope[cluster]'"
DEFAULT_TIMEOUT_S = 10.0
TIMEOUT_ENV = "SRTSCOPE_CLUSTER_TIMEOUT"
#: a read may run this long on a worker: far beyond the reads measured (a 10 GB export: ~2 min of CPU)
DEFAULT_READ_TIMEOUT_S = 3600.0
READ_TIMEOUT_ENV = "SRTSCOPE_CLUSTER_READ_TIMEOUT"
SHARED_PATHS = "--cluster workers read the files by path: they must see the same paths (e.g. a shared filesystem)"


class ClusterError(RuntimeError):
    """The cluster cannot do the reads (not a fault of a trace). The message is one line."""

    def __init__(self, what: str) -> None:
        super().__init__(" ".join(str(what).split()))


def _seconds(env: str, default: float, most: float) -> float:
    """``$env`` as seconds, 0 < T <= ``most``; ``default`` when unset or empty; else ``ClusterError``."""
    raw = os.environ.get(env, "").strip()
    if not raw:
        return default
    try:
        t = float(raw)
    except ValueError:
        t = -1.0
    if not 0 < t <= most:
        raise ClusterError(f"${env}={raw!r}: expected seconds, 0 < T <= {most:g}")
    return t


def connect_timeout_s() -> float:
    """Seconds to reach the scheduler, to see a worker, and for every answer while reading (``T``):
    ``$SRTSCOPE_CLUSTER_TIMEOUT`` (0 < T <= 3600), else 10."""
    return _seconds(TIMEOUT_ENV, DEFAULT_TIMEOUT_S, 3600)


def read_timeout_s() -> float:
    """Seconds one read may run on a worker (``R``): ``$SRTSCOPE_CLUSTER_READ_TIMEOUT`` (0 < R <= 7
    days), else 3600."""
    return _seconds(READ_TIMEOUT_ENV, DEFAULT_READ_TIMEOUT_S, 7 * 86400)


def _versions() -> tuple[str, int]:
    """What a worker must share with this process for its Timelines to be the ones read here."""
    from srtscope import __version__
    from srtscope.analyzers.cache.table_cache import READER_VERSION
    return __version__, READER_VERSION


def _worker_name() -> str:
    """``tcp://10.0.0.7:40123 (host node7)`` inside a task; the host name alone elsewhere."""
    try:
        from distributed import get_worker
        return f"{get_worker().address} (host {socket.gethostname()})"
    except (ImportError, ValueError):
        return f"on host {socket.gethostname()}"


def read_task(path: str, rank: int, allow_no_kernels: bool, cache: bool, versions: tuple[str, int]) -> Timeline:
    """``read_one`` on a worker, after checking that the worker runs the same reader and sees the file."""
    from srtscope.analyzers.readers import read_one

    if _versions() != versions:
        raise ClusterError(f"Dask worker {_worker_name()} runs srtscope {_versions()[0]} (reader "
                           f"{_versions()[1]}), this machine {versions[0]} (reader {versions[1]}): "
                           "install the same srtscope on the workers")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)     # a FIFO must not block it
        try:
            mode = os.fstat(fd).st_mode
        finally:
            os.close(fd)
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(path)
        if not stat.S_ISREG(mode):
            raise TraceError(path, f"is not a regular file on Dask worker {_worker_name()} (a FIFO, socket "
                                   "or device); give the trace file itself")
    except FileNotFoundError:
        raise TraceError(path, f"no such file on Dask worker {_worker_name()}; {SHARED_PATHS}") from None
    except IsADirectoryError:
        raise TraceError(path, f"is a directory on Dask worker {_worker_name()}; with --cluster give the "
                               "rank files themselves unless this machine sees the folder too") from None
    except OSError as exc:
        raise TraceError(path, f"cannot be read on Dask worker {_worker_name()} "
                               f"({exc.strerror or exc}); {SHARED_PATHS}") from None
    try:
        return read_one(path, rank, allow_no_kernels, cache)
    except ImportError as exc:
        # NOTE: locally an ImportError is our bug; on a worker it is most often its environment
        raise ClusterError(f"{path}: Dask worker {_worker_name()} cannot import {exc.name or exc}: "
                           "install srtscope (same version, same extras) on the workers") from None


@contextmanager
def _quiet_logs() -> Iterator[None]:
    """Silence the log lines of distributed, tornado and asyncio while a client lives (each failure
    becomes our one line); their levels are restored after."""
    names = {"distributed", "tornado", "asyncio"} | {
        n for n in logging.root.manager.loggerDict if n.startswith(("distributed.", "tornado."))}
    loggers = [logging.getLogger(n) for n in sorted(names)]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for lg, lv in zip(loggers, levels):
            lg.setLevel(lv)


class ClusterReads:
    """Reads of trace files on the cluster behind one ``distributed.Client`` (see ``connect``).
    ``timeout_s``: ``T``, every answer's deadline; ``read_timeout_s``: ``R``, one read's."""

    def __init__(self, client: Any, address: str, timeout_s: float = DEFAULT_TIMEOUT_S,
                 read_timeout_s: float = DEFAULT_READ_TIMEOUT_S) -> None:
        self.client = client
        self.address = address
        self.timeout_s = timeout_s
        self.read_timeout_s = read_timeout_s

    def read(self, files: Sequence[Path], hints: Sequence[int], allow_no_kernels: bool, cache: bool,
             progress: Callable[[float, str], None] | None = None) -> list[Timeline]:
        """``read_one(files[i], hints[i], ...)`` for every file, one task each; in the files' order.
        ``progress(fraction of files read, what)`` after each file. The first failure read, or the
        first limit of ``cluster_watch`` passed, raises (``TraceError`` / ``ClusterError``) and
        cancels the rest."""
        from distributed.client import FutureCancelledError
        from distributed.scheduler import KilledWorker

        if not files:
            return []
        versions = _versions()
        # NOTE: pure=False (a fresh key per task): a file may change between two loads, so never
        # reuse a result the scheduler still holds for the same arguments
        futs = [self.client.submit(read_task, str(f), int(h), allow_no_kernels, cache, versions, pure=False)
                for f, h in zip(files, hints)]
        index = {fut.key: i for i, fut in enumerate(futs)}
        watch = ReadWatch(self.client, self.address, {k: files[i] for k, i in index.items()},
                          self.timeout_s, self.read_timeout_s, ClusterError)
        out: list[Timeline | None] = [None] * len(files)
        try:
            for done, fut in enumerate(self._finished(futs, watch), 1):
                i = index[fut.key]
                try:
                    # NOTE: the result comes from the worker now (a whole Timeline, maybe large):
                    # R, not T, bounds it
                    out[i] = fut.result(timeout=self.read_timeout_s)
                except KilledWorker:
                    raise ClusterError(f"{files[i]}: the Dask workers reading it died, one after another "
                                       "(out of memory?)") from None
                except FutureCancelledError:
                    raise ClusterError(f"{files[i]}: its read was cancelled on the cluster at {self.address} "
                                       "(scheduler restarted or connection lost)") from None
                except (TraceError, ClusterError):
                    raise
                except ImportError as exc:
                    # a worker that cannot load the task at all (srtscope not installed there)
                    raise ClusterError(f"{files[i]}: a Dask worker cannot import {exc.name or exc}: install "
                                       "srtscope (same version, same extras) on the workers") from None
                except (TimeoutError, asyncio.TimeoutError):        # NOTE: before OSError, its base
                    raise ClusterError(f"{files[i]}: its read finished but its result did not arrive from "
                                       f"the cluster at {self.address} within {self.read_timeout_s:g} s "
                                       f"(${READ_TIMEOUT_ENV})") from None
                except OSError as exc:
                    raise ClusterError(f"{files[i]}: lost the Dask scheduler at {self.address} while "
                                       f"reading ({type(exc).__name__}: {exc})") from None
                if progress is not None:
                    progress(done / len(files), f"read {files[i].name}")
        except BaseException:
            self._cancel(futs)
            raise
        return [t for t in out if t is not None]

    def _cancel(self, futs: list[Any]) -> None:
        """Cancel the reads left, waiting at most ``timeout_s`` (the scheduler may be the trouble)."""
        def cancel() -> None:
            try:
                self.client.cancel(futs)
            except Exception:  # noqa: BLE001 - a scheduler that is gone
                pass

        t = threading.Thread(target=cancel, name="srtscope-cluster-cancel", daemon=True)
        t.start()
        t.join(self.timeout_s)

    def _finished(self, futs: list[Any], watch: ReadWatch) -> Iterator[Any]:
        """``futs`` as they finish; every ``timeout_s`` while some are left, ``watch.check`` of those
        (it raises ``ClusterError`` on a limit passed)."""
        import queue

        finished: queue.Queue[Any] = queue.Queue()
        for f in futs:
            f.add_done_callback(finished.put)
        left = {f.key for f in futs}
        next_check = time.monotonic() + self.timeout_s
        while left:
            try:
                fut = finished.get(timeout=max(0.0, next_check - time.monotonic()))
            except queue.Empty:
                fut = None
            if fut is not None:
                left.discard(fut.key)
                yield fut
            if left and time.monotonic() >= next_check:
                # NOTE: on a clock, not after a spell without a finished read: a stopped worker's
                # read is noticed while other reads keep finishing
                watch.check(left)
                next_check = time.monotonic() + self.timeout_s


def _brief(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200] or type(exc).__name__


def _probe(address: str, t: float) -> None:
    """For a ``tcp://`` scheduler: a TCP connection within ``t`` s, then its greeting (a Dask
    scheduler speaks first) within ``t`` s; else ClusterError. Other schemes are left to distributed."""
    from distributed.comm import get_address_host_port, parse_address

    if parse_address(address)[0] != "tcp":
        return
    host, port = get_address_host_port(address)
    deadline = time.monotonic() + t
    while True:         # refused: retried until the deadline, as distributed does (a scheduler starting)
        try:
            sock = socket.create_connection((host, port), timeout=max(0.01, deadline - time.monotonic()))
            break
        except ConnectionRefusedError as exc:
            if time.monotonic() + 0.1 >= deadline:
                raise ClusterError(f"--cluster {address}: cannot reach a Dask scheduler within {t:g} s "
                                   f"({_brief(exc)})") from None
            time.sleep(0.1)
        except OSError as exc:
            raise ClusterError(f"--cluster {address}: cannot reach a Dask scheduler within {t:g} s "
                               f"({_brief(exc)})") from None
    try:
        with sock:
            sock.settimeout(t)
            greeting = sock.recv(1)
    except TimeoutError:
        raise ClusterError(f"--cluster {address}: the listener there accepted the connection but said "
                           f"nothing within {t:g} s: not a Dask scheduler, or a hung one") from None
    except OSError as exc:
        raise ClusterError(f"--cluster {address}: the connection failed ({_brief(exc)})") from None
    if not greeting:
        raise ClusterError(f"--cluster {address}: the listener there closed the connection without "
                           "a word: not a Dask scheduler")


@contextmanager
def connect(address: str, timeout_s: float | None = None) -> Iterator[ClusterReads]:
    """A client of the Dask scheduler at ``address`` (``tcp://host:8786``, as ``distributed.Client``
    takes it) with at least one worker, within ``timeout_s`` (default ``connect_timeout_s()``) for
    each; its reads limited by ``read_timeout_s()`` too (``cluster_watch``); closed on exit, failed or
    not, and distributed's log lines silenced meanwhile. ``ClusterError`` when distributed is not
    installed or the cluster is not there in time."""
    if not address or not address.strip():
        raise ClusterError("--cluster: empty scheduler address (e.g. tcp://scheduler:8786)")
    try:
        import distributed
    except ImportError:
        raise ClusterError(f"--cluster needs Dask distributed, which is not installed: {INSTALL_HINT}") from None
    t = connect_timeout_s() if timeout_s is None else timeout_s
    r = read_timeout_s()
    from distributed.comm import get_address_host_port
    try:
        _, port = get_address_host_port(address)  # NOTE: before Client(): a half-made one stalls the exit 4 s
    except ValueError as exc:
        raise ClusterError(f"--cluster {address}: not a Dask scheduler address, e.g. tcp://scheduler:8786 "
                           f"({_brief(exc)})") from None
    if isinstance(port, int) and not 1 <= port <= 65535:
        raise ClusterError(f"--cluster {address}: port {port} is outside 1..65535")
    _probe(address, t)
    with _quiet_logs():
        client = _start_client(distributed.Client, address, t)
        try:
            try:
                client.wait_for_workers(1, timeout=t)
            except Exception:  # noqa: BLE001 - TimeoutError, or the scheduler going away meanwhile
                raise ClusterError(f"--cluster {address}: the scheduler has no workers (none joined within "
                                   f"{t:g} s)") from None
            yield ClusterReads(client, address, t, r)
        finally:
            _close(client, t)


def _start_client(client_class: type, address: str, t: float) -> Any:
    """A started ``client_class(address)`` within ``2 t`` s, else ``ClusterError`` (a client half
    made by then is closed first)."""
    made: dict[str, Any] = {}

    class Client(client_class):  # type: ignore[misc, valid-type]
        def start(self, **kwargs: Any) -> None:
            made["client"] = self       # NOTE: kept before a start that may fail, to be closed
            super().start(**kwargs)

    def make() -> None:
        try:
            Client(address, timeout=t, set_as_default=False)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            made["error"] = exc

    # NOTE: on a thread of its own, so that a scheduler that stalls the client's start (its
    # handshake has no deadline in distributed) cannot stall this process past 2 T
    starter = threading.Thread(target=make, name="srtscope-cluster-connect", daemon=True)
    starter.start()
    starter.join(2 * t)
    error = made.pop("error", None)
    client = made.pop("client", None)
    if not starter.is_alive() and error is None:
        return client
    if starter.is_alive():
        failed = f"the scheduler did not complete the client's start within {2 * t:g} s"
    elif isinstance(error, (ValueError, TypeError)):     # no scheme, an unknown scheme, no port, no TLS
        failed = f"cannot connect ({_brief(error)})"
        if address.startswith("tls://") and "ssl_context" in str(error):
            failed += ("; tls:// takes Dask's TLS settings: distributed.comm.tls.ca-file, .client.cert "
                       "and .client.key in the Dask config (or $DASK_DISTRIBUTED__COMM__TLS__...)")
    elif isinstance(error, Exception):                   # OSError, TimeoutError ...
        failed = f"cannot reach a Dask scheduler within {t:g} s ({_brief(error)})"
    else:
        raise error             # KeyboardInterrupt, SystemExit
    error = None                # NOTE: its traceback holds the client's frames
    if client is not None:
        _close(client, t)
    raise ClusterError(f"--cluster {address}: {failed}")


def _close(client: Any, t: float) -> None:
    """Close ``client`` within about ``t`` s, on a thread (its scheduler may be stopped). One that
    could not close is marked closed: its ``__del__`` would try again at exit, wait ``2 T`` and print
    a traceback."""
    def close() -> None:
        try:
            client.close(timeout=t)
        except BaseException:  # noqa: BLE001 - a scheduler that is gone; a loop already stopped
            pass

    closer = threading.Thread(target=close, name="srtscope-cluster-close", daemon=True)
    closer.start()
    closer.join(t + 1)
    if getattr(client, "status", "closed") != "closed":
        client.status = "closed"
