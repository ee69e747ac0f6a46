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

Deadlines: every wait on the network is bounded by ``$SRTSCOPE_CLUSTER_TIMEOUT`` seconds (default
10): reaching the scheduler (a TCP connection, then its greeting: a listener that accepts and says
nothing is refused), the client's start, the first worker, and while the reads run, each spell of
``T`` without a finished read is followed by a ping the scheduler must answer within ``T``. A read
itself may take as long as the file needs while the scheduler answers.
"""
from __future__ import annotations

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
from srtscope.analyzers.readers.errors import TraceError

__all__ = ["ClusterError", "ClusterReads", "connect", "connect_timeout_s"]

INSTALL_HINT = "pip install 'srtscope[cluster]'"
DEFAULT_TIMEOUT_S = 10.0
TIMEOUT_ENV = "SRTSCOPE_CLUSTER_TIMEOUT"
SHARED_PATHS = "--cluster workers read the files by path: they must see the same paths (e.g. a shared filesystem)"


class ClusterError(RuntimeError):
    """The cluster cannot do the reads (not a fault of a trace). The message is one line."""

    def __init__(self, what: str) -> None:
        super().__init__(" ".join(str(what).split()))


def connect_timeout_s() -> float:
    """Seconds to reach the scheduler and to see a worker: ``$SRTSCOPE_CLUSTER_TIMEOUT`` (> 0), else 10."""
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        t = float(raw)
    except ValueError:
        t = -1.0
    if not 0 < t <= 3600:
        raise ClusterError(f"${TIMEOUT_ENV}={raw!r}: expected seconds, 0 < T <= 3600")
    return t


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
def _quiet_connect_logs() -> Iterator[None]:
    """Silence distributed's own log lines while connecting (the failure becomes our one line)."""
    loggers = [logging.getLogger(n) for n in ("distributed", "distributed.client", "distributed.comm",
                                               "distributed.core", "tornado")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for lg, lv in zip(loggers, levels):
            lg.setLevel(lv)


class ClusterReads:
    """Reads of trace files on the cluster behind one ``distributed.Client`` (see ``connect``)."""

    def __init__(self, client: Any, address: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.client = client
        self.address = address
        self.timeout_s = timeout_s

    def read(self, files: Sequence[Path], hints: Sequence[int], allow_no_kernels: bool, cache: bool,
             progress: Callable[[float, str], None] | None = None) -> list[Timeline]:
        """``read_one(files[i], hints[i], ...)`` for every file, one task each; in the files' order.
        ``progress(fraction of files read, what)`` after each file. The first failure read raises
        (``TraceError`` / ``ClusterError``) and cancels the rest."""
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
        out: list[Timeline | None] = [None] * len(files)
        try:
            for done, fut in enumerate(self._finished(futs), 1):
                i = index[fut.key]
                try:
                    out[i] = fut.result()
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

    def _finished(self, futs: list[Any]) -> Iterator[Any]:
        """``futs`` as they finish; after each ``timeout_s`` without one, the scheduler must answer
        a ping within ``timeout_s`` or ``ClusterError``."""
        import queue

        finished: queue.Queue[Any] = queue.Queue()
        for f in futs:
            f.add_done_callback(finished.put)
        for _ in futs:
            while True:
                try:
                    yield finished.get(timeout=self.timeout_s)
                    break
                except queue.Empty:
                    self._ping()

    def _ping(self) -> None:
        try:
            self.client.sync(self.client.scheduler.identity, callback_timeout=self.timeout_s)
        except Exception:  # noqa: BLE001 - TimeoutError, a closed comm
            raise ClusterError(f"--cluster {self.address}: the scheduler stopped answering (nothing within "
                               f"{self.timeout_s:g} s); the reads were given up") from None


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
    each; closed on exit. ``ClusterError`` when distributed is not installed or the cluster is not
    there in time."""
    if not address or not address.strip():
        raise ClusterError("--cluster: empty scheduler address (e.g. tcp://scheduler:8786)")
    try:
        import distributed
    except ImportError:
        raise ClusterError(f"--cluster needs Dask distributed, which is not installed: {INSTALL_HINT}") from None
    t = connect_timeout_s() if timeout_s is None else timeout_s
    from distributed.comm import get_address_host_port
    try:
        _, port = get_address_host_port(address)  # NOTE: before Client(): a half-made one stalls the exit 4 s
    except ValueError as exc:
        raise ClusterError(f"--cluster {address}: not a Dask scheduler address, e.g. tcp://scheduler:8786 "
                           f"({_brief(exc)})") from None
    if isinstance(port, int) and not 1 <= port <= 65535:
        raise ClusterError(f"--cluster {address}: port {port} is outside 1..65535")
    _probe(address, t)
    failed = ""
    with _quiet_connect_logs():
        made: dict[str, Any] = {}

        def make() -> None:
            try:
                made["client"] = distributed.Client(address, timeout=t, set_as_default=False)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                made["error"] = exc

        # NOTE: on a thread of its own, so that a scheduler that stalls the client's start (its
        # handshake has no deadline in distributed) cannot stall this process past 2 T
        starter = threading.Thread(target=make, name="srtscope-cluster-connect", daemon=True)
        starter.start()
        starter.join(2 * t)
        error = made.get("error")
        if starter.is_alive():
            failed = f"the scheduler did not complete the client's start within {2 * t:g} s"
        elif isinstance(error, (ValueError, TypeError)):     # no scheme, an unknown scheme, no port
            failed = f"cannot connect ({_brief(error)})"
        elif isinstance(error, Exception):                   # OSError, TimeoutError ...
            failed = f"cannot reach a Dask scheduler within {t:g} s ({_brief(error)})"
        elif error is not None:
            raise error
        client: Any = made.get("client")
    # NOTE: raised here, not in the handler, and collected now: a half-made client that lives
    # until exit stalls it (its __del__ waits 2x the timeout for a loop that is gone)
    if failed:
        import gc
        gc.collect()
        raise ClusterError(f"--cluster {address}: {failed}")
    try:
        try:
            client.wait_for_workers(1, timeout=t)
        except Exception:  # noqa: BLE001 - TimeoutError, or the scheduler going away meanwhile
            raise ClusterError(f"--cluster {address}: the scheduler has no workers (none joined within "
                               f"{t:g} s)") from None
        yield ClusterReads(client, address, t)
    finally:
        with _quiet_connect_logs():
            try:
                client.close(timeout=t)
            except Exception:  # noqa: BLE001 - closing a client whose scheduler is gone
                pass
