"""Staging of one step's host inputs onto the device for the overlap loop on CUDA.

The overlap loop on CUDA runs forwards on a dedicated *forward stream* and copies each step's
inputs (ids, positions, seq lens, out_cache_loc, req-to-token writes, sampling tensors) with one
host->device copy on a *copy stream*, so the copy of step t+1 can overlap the forward of step t.

Buffers live in a ring of slots; each slot is a pinned host arena and a device arena, with two
events (the write-after-read rule, enforced by events, never by luck):

- ``copied``: recorded on the copy stream after the H2D copy that read the slot's host arena. The
  host arena is not rewritten until it has completed (``query``, else ``synchronize``); the
  forward stream waits on it before reading the device arena (read-after-write).
- ``consumed``: recorded on the forward stream after the forward that read the slot's device
  arena. The copy stream waits on it before the next H2D into that arena (write-after-read).

``StagingRing`` is the pure bookkeeping (any event-like object with ``query``/``synchronize``);
``TensorStager`` packs tensors into a slot and unpacks device views; ``CudaStreams`` does the
stream and event work. The module imports without CUDA; tests run the first two on the CPU.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

ALIGN = 64    # byte alignment of each tensor inside an arena (any dtype's itemsize divides it)


@dataclass
class Slot:
    """One arena pair. ``state``: free -> filling -> copied -> consumed (-> filling ...)."""

    index: int
    host: torch.Tensor | None = None     # uint8, pinned on CUDA
    dev: torch.Tensor | None = None      # uint8 on the device
    copied: Any = None                   # event after the H2D that read ``host``
    consumed: Any = None                 # event after the forward that read ``dev``
    state: str = "free"
    uses: int = 0


@dataclass
class RingStats:
    host_waits: int = 0       # a pinned arena was reused before its copy had finished
    grows: int = 0
    acquires: int = 0


class StagingRing:
    """Round-robin slots; ``acquire`` returns a slot whose host arena may be written now and
    whose device arena may be written by a copy that first waits on ``slot.consumed``."""

    def __init__(self, n_slots: int, alloc: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
                 min_bytes: int = 1 << 16) -> None:
        if n_slots < 2:
            raise ValueError(f"n_slots: at least 2 (one in flight, one being staged), "
                             f"got {n_slots}")
        self.slots = [Slot(i) for i in range(n_slots)]
        self.alloc = alloc
        self.min_bytes = min_bytes
        self.stats = RingStats()
        self._next = 0

    def acquire(self, nbytes: int) -> Slot:
        slot = self.slots[self._next]
        if slot.state in ("filling", "copied"):
            # NOTE: a slot is only reused after the forward that read it was launched and its
            # ``consumed`` event recorded; otherwise a stream wait on it would be a no-op.
            raise RuntimeError(f"staging slot {slot.index} reused while still {slot.state}: "
                               "more steps in flight than slots")
        self._next = (self._next + 1) % len(self.slots)
        self.stats.acquires += 1
        if slot.copied is not None and not slot.copied.query():
            self.stats.host_waits += 1
            slot.copied.synchronize()          # the pinned arena is about to be rewritten
        if slot.host is None or slot.host.numel() < nbytes:
            self.stats.grows += slot.host is not None
            if slot.consumed is not None:
                slot.consumed.synchronize()    # the old device arena may still be read
            size = max(self.min_bytes, 1 << max(0, (nbytes - 1).bit_length()))
            slot.host, slot.dev = self.alloc(size)
            slot.copied = slot.consumed = None
        slot.state = "filling"
        slot.uses += 1
        return slot

    def mark_copied(self, slot: Slot, event: Any) -> None:
        if slot.state != "filling":
            raise RuntimeError(f"slot {slot.index}: mark_copied while {slot.state}")
        slot.copied, slot.state = event, "copied"

    def mark_consumed(self, slot: Slot, event: Any) -> None:
        if slot.state != "copied":
            raise RuntimeError(f"slot {slot.index}: mark_consumed while {slot.state}")
        slot.consumed, slot.state = event, "consumed"

    def abandon(self, slot: Slot) -> None:
        """After a failed step, once the caller has synchronized the forward stream: the slot's
        device arena is no longer read, so it may be reused."""
        if slot.copied is not None:
            slot.copied.synchronize()
        slot.consumed, slot.state = None, "consumed"

    def synchronize(self) -> None:
        """Wait for every recorded copy and forward (before the arenas are dropped)."""
        for s in self.slots:
            for ev in (s.copied, s.consumed):
                if ev is not None:
                    ev.synchronize()


def layout(tensors: Sequence[torch.Tensor]) -> tuple[list[int], int]:
    """Byte offsets (``ALIGN``-aligned) of each tensor in an arena, and the bytes used."""
    offsets, off = [], 0
    for t in tensors:
        offsets.append(off)
        off += -(-t.numel() * t.element_size() // ALIGN) * ALIGN
    return offsets, off


def _view(arena: torch.Tensor, off: int, t: torch.Tensor) -> torch.Tensor:
    n = t.numel() * t.element_size()
    return arena[off:off + n].view(t.dtype).view(t.shape)


class TensorStager:
    """Packs host tensors into a ring slot and issues one H2D copy.

    ``copy(dst, src, wait_event) -> event`` is injected: on CUDA (``CudaStreams.copy``) the copy
    stream waits on ``wait_event``, copies ``non_blocking`` from pinned memory and records an
    event; on the CPU (tests) it is a plain copy and a fake event.
    """

    def __init__(self, ring: StagingRing, copy: Callable[[Any, Any, Any], Any]) -> None:
        self.ring = ring
        self.copy = copy     # copy(dst, src, wait_event) -> event recorded after the copy

    def stage(self, tensors: Sequence[torch.Tensor]) -> tuple[Slot, list[torch.Tensor]]:
        """Device views of ``tensors`` (same dtypes and shapes) and the slot they live in."""
        offsets, used = layout(tensors)
        slot = self.ring.acquire(max(used, 1))
        host, dev = slot.host, slot.dev
        assert host is not None and dev is not None     # acquire() gives an allocated slot
        for t, off in zip(tensors, offsets):
            _view(host, off, t).copy_(t)
        if used:
            ev = self.copy(dev[:used], host[:used], slot.consumed)
        else:
            ev = self.copy(None, None, slot.consumed)
        self.ring.mark_copied(slot, ev)
        return slot, [_view(dev, off, t) for t, off in zip(tensors, offsets)]


# ---------------------------------------------------------------------------------------------
_SHARED = frozenset({"req_to_token"})


def host_tensors(fb: Any, writes: tuple | None) -> tuple[list[torch.Tensor], Callable]:
    """The host tensors of a ForwardBatch (its sampling info included) and the pending
    req-to-token writes, and a function that rebuilds ``(fb, writes)`` from their device views."""
    # NOTE: ``req_to_token`` is the pool's shared device table (written in stream order by
    # ``write_device``), never a per-step input: it is not staged.
    fb_names = [f.name for f in dataclasses.fields(fb)
                if f.name not in _SHARED and isinstance(getattr(fb, f.name), torch.Tensor)
                and getattr(fb, f.name).device.type == "cpu"]
    sampling = getattr(fb, "sampling", None)
    s_names = [] if sampling is None else [
        f.name for f in dataclasses.fields(sampling)
        if isinstance(getattr(sampling, f.name), torch.Tensor)
        and getattr(sampling, f.name).device.type == "cpu"]
    tensors = [getattr(fb, n) for n in fb_names] + [getattr(sampling, n) for n in s_names]
    n_w = 0 if writes is None else len(writes)
    if writes is not None:
        tensors += list(writes)

    def rebuild(views: list[torch.Tensor]) -> tuple[Any, tuple | None]:
        k = len(fb_names)
        kw: dict[str, Any] = dict(zip(fb_names, views[:k]))
        if s_names:
            assert sampling is not None
            kw["sampling"] = dataclasses.replace(sampling, **dict(zip(s_names,
                                                                      views[k:k + len(s_names)])))
        new_w = tuple(views[len(views) - n_w:]) if writes is not None else None
        return dataclasses.replace(fb, **kw), new_w

    return tensors, rebuild


class CudaStreams:
    """The forward and copy streams of one CUDA device and the event work on them. (Tests pass an
    object with the same methods that runs on the CPU.)"""

    def __init__(self, device: torch.device, n_slots: int = 3) -> None:
        self.device = device
        self.forward = torch.cuda.Stream(device=device)
        self.copy_stream = torch.cuda.Stream(device=device)
        self.ring = StagingRing(n_slots, self.alloc)

    def alloc(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.empty(n, dtype=torch.uint8, pin_memory=True),
                torch.empty(n, dtype=torch.uint8, device=self.device))

    def forward_ctx(self):
        return torch.cuda.stream(self.forward)

    def copy(self, dst: torch.Tensor | None, src: torch.Tensor | None, wait_event: Any) -> Any:
        """H2D on the copy stream after the slot's ``consumed`` event; the event after it."""
        cs = self.copy_stream
        if wait_event is not None:
            cs.wait_event(wait_event)        # write-after-read: an earlier forward read ``dst``
        with torch.cuda.stream(cs):
            if dst is not None and src is not None:
                dst.copy_(src, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(cs)
        return ev

    def forward_wait(self, event: Any) -> None:
        self.forward.wait_event(event)

    def record(self) -> Any:
        ev = torch.cuda.Event()
        ev.record(self.forward)
        return ev

    def to_host(self, t: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """A non-blocking D2H copy into pinned memory on the forward stream, and its event."""
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        with torch.cuda.stream(self.forward):
            # NOTE: the pinned block goes back to torch's caching host allocator when ``host``
            # dies; that allocator records this copy's stream, so it is not reused too early.
            host.copy_(t, non_blocking=True)
        return host, self.record()

    def synchronize(self) -> None:
        self.forward.synchronize()
        self.copy_stream.synchronize()
