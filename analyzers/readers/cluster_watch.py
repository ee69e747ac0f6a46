"""The deadlines of reads running on a Dask cluster (``ClusterReads.read``): a check every ``T`` s
while reads are left, each a question to the scheduler that must be answered within ``T``.

Dask itself would wait for ever on a read whose worker died with no worker left (the task waits for
one), and 5 minutes (its ``worker-ttl``) on a worker that is stopped or hung, then start the read
again elsewhere or on the same stopped machine. A check gives the reads up with one ``ClusterError``
when:

- the scheduler does not answer within ``T`` (stopped, or the network is gone);
- no worker has been left for ``T`` (none rejoined, e.g. by a nanny's restart);
- the worker running a read has not been heard from for ``silence_s`` (its heartbeat, as the
  scheduler records it: every 0.5 s on a cluster of up to 10 workers, ``n / 200 + 1`` s beyond);
- a read has been running on one worker for more than ``read_timeout_s`` (``R``).

The times are this machine's (``time.monotonic``), taken when a check sees a change, so each limit
is noticed up to one check interval late; never before its time.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["ReadWatch", "silence_s"]


def silence_s(timeout_s: float, n_workers: int) -> float:
    """Seconds without a heartbeat after which a worker counts as stopped: at least ``timeout_s``,
    and at least twice Dask's slowest heartbeat on a cluster of ``n_workers`` (2 s + n / 100)."""
    return max(timeout_s, 2.0 + n_workers / 100)


class ReadWatch:
    """The state of the checks over one batch of reads: ``check(pending)`` raises what gives them up.

    ``client``: a ``distributed.Client``; ``files``: the file each task key reads; ``error``: the
    exception class to raise (``ClusterError``: one line)."""

    def __init__(self, client: Any, address: str, files: Mapping[Any, Path], timeout_s: float,
                 read_timeout_s: float, error: Callable[[str], Exception],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.address = address
        self.files = files
        self.timeout_s = timeout_s
        self.read_timeout_s = read_timeout_s
        self.error = error
        self.clock = clock
        self._no_workers_since: float | None = None
        self._heard: dict[str, tuple[Any, float]] = {}       # worker -> (its last_seen, when it moved)
        self._running: dict[tuple[Any, str], float] = {}     # (key, worker) -> when first seen running

    def _ask(self, rpc: Callable[..., Any], **kwargs: Any) -> Any:
        """The scheduler's answer to ``rpc(**kwargs)`` within ``timeout_s``, else ``error``."""
        try:
            return self.client.sync(rpc, callback_timeout=self.timeout_s, **kwargs)
        except Exception:  # noqa: BLE001 - TimeoutError, a closed comm
            raise self.error(f"--cluster {self.address}: the scheduler stopped answering (nothing within "
                             f"{self.timeout_s:g} s); the reads were given up") from None

    def check(self, pending: Iterable[Any]) -> None:
        """Ask the scheduler how the ``pending`` task keys stand; raise ``error`` on a limit passed."""
        now = self.clock()
        workers = self._ask(self.client.scheduler.identity).get("workers") or {}
        if not workers:
            if self._no_workers_since is None:
                self._no_workers_since = now
            elif now - self._no_workers_since >= self.timeout_s:
                raise self.error(f"--cluster {self.address}: no Dask worker left (none for "
                                 f"{now - self._no_workers_since:.0f} s; the last one died or left "
                                 "during the reads); the reads were given up")
            return
        self._no_workers_since = None
        pending = set(pending)
        processing = self._ask(self.client.scheduler.processing) or {}
        quiet = silence_s(self.timeout_s, len(workers))
        for worker, keys in processing.items():
            ours = [k for k in keys if k in pending]
            if not ours or worker not in workers:
                continue
            seen = workers[worker].get("last_seen")
            if worker not in self._heard or self._heard[worker][0] != seen:
                self._heard[worker] = (seen, now)
            elif now - self._heard[worker][1] >= quiet:
                raise self.error(f"{self.files[ours[0]]}: Dask worker {worker} reading it has not been "
                                 f"heard from for {now - self._heard[worker][1]:.0f} s (stopped or hung); "
                                 "the reads were given up")
            for key in ours:
                began = self._running.setdefault((key, worker), now)
                if now - began > self.read_timeout_s:
                    raise self.error(f"{self.files[key]}: its read on Dask worker {worker} ran past "
                                     f"{self.read_timeout_s:g} s ($SRTSCOPE_CLUSTER_READ_TIMEOUT); "
                                     "the reads were given up")
