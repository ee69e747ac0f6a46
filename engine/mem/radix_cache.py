"""RadixCache: a radix tree over token ids whose nodes own the KV slots of their tokens.

Invariants:
- every cached slot belongs to exactly one node; a slot is either free in the allocator, owned by
  a tree node, or held privately by a resident request;
- ``lock_ref > 0`` on a node means some request reads it; locks are taken and released along the
  whole path to the root, so a locked node's ancestors are locked too;
- eviction removes only unlocked leaves, least recently used first (``last_access`` is a logical
  clock bumped by every match and insert);
- ``evictable_size() + protected_size()`` == total cached tokens.
"""
from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from srtscope.engine.mem.allocator import TokenSlotAllocator
from srtscope.engine.mem.req_to_token import ReqToTokenPool

if TYPE_CHECKING:
    from srtscope.engine.request import Req

_EMPTY = np.zeros(0, dtype=np.int64)


class TreeNode:
    __slots__ = ("children", "parent", "key", "value", "lock_ref", "last_access", "id")
    _ids = itertools.count()

    def __init__(self, key: np.ndarray, value: np.ndarray, parent: TreeNode | None) -> None:
        self.children: dict[int, TreeNode] = {}
        self.parent = parent
        self.key = key          # int64 token ids
        self.value = value      # int64 KV slots, same length as key
        self.lock_ref = 0
        self.last_access = 0
        self.id = next(TreeNode._ids)

    def __repr__(self) -> str:
        return f"TreeNode(id={self.id}, len={len(self.key)}, lock={self.lock_ref})"


@dataclass(frozen=True)
class MatchResult:
    indices: np.ndarray     # KV slots of the matched prefix (int64)
    last_node: Any          # deepest matched node (lock this while using the prefix)

    @property
    def length(self) -> int:
        return len(self.indices)


def _common_len(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    neq = a[:n] != b[:n]
    return int(neq.argmax()) if neq.any() else n


class RadixCache:
    enabled = True

    def __init__(self, allocator: TokenSlotAllocator, req_to_token: ReqToTokenPool) -> None:
        self.allocator = allocator
        self.req_to_token = req_to_token
        self.reset()

    def reset(self) -> None:
        self.root = TreeNode(_EMPTY, _EMPTY, None)
        self.root.lock_ref = 1          # the root is never evicted
        self._evictable = 0
        self._protected = 0
        self._clock = itertools.count(1)

    # -- sizes ---------------------------------------------------------------------------------
    def evictable_size(self) -> int:
        return self._evictable

    def protected_size(self) -> int:
        return self._protected

    def total_size(self) -> int:
        return self._evictable + self._protected

    # -- lookup and insert ---------------------------------------------------------------------
    def match_prefix(self, key: Sequence[int] | np.ndarray) -> MatchResult:
        """Longest cached prefix of ``key``. A hit ending inside a node splits that node so that
        the returned ``last_node`` covers exactly the matched tokens."""
        key = np.asarray(key, dtype=np.int64)
        t = next(self._clock)
        node, pos, parts = self.root, 0, []
        while pos < len(key):
            child = node.children.get(int(key[pos]))
            if child is None:
                break
            child.last_access = t
            n = _common_len(child.key, key[pos:])
            if n < len(child.key):
                child = self._split(child, n)
            parts.append(child.value)
            pos += n
            node = child
        indices = np.concatenate(parts) if parts else _EMPTY
        return MatchResult(indices, node)

    def insert(self, key: Sequence[int] | np.ndarray, value: np.ndarray) -> int:
        """Cache ``value`` (slots) for ``key``; returns how many leading tokens were already cached
        (the caller frees its own duplicate slots for those)."""
        key = np.asarray(key, dtype=np.int64)
        value = np.asarray(value, dtype=np.int64)
        if len(key) != len(value):
            raise ValueError(f"key and value lengths differ: {len(key)} != {len(value)}")
        t = next(self._clock)
        node, pos = self.root, 0
        while pos < len(key):
            child = node.children.get(int(key[pos]))
            if child is None:
                leaf = TreeNode(key[pos:].copy(), value[pos:].copy(), node)
                leaf.last_access = t
                node.children[int(key[pos])] = leaf
                self._evictable += len(leaf.key)
                return pos
            child.last_access = t
            n = _common_len(child.key, key[pos:])
            if n < len(child.key):
                child = self._split(child, n)
            pos += n
            node = child
        return pos

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Split ``child`` after its first n tokens; returns the new upper node."""
        parent = child.parent
        assert parent is not None and 0 < n < len(child.key)
        upper = TreeNode(child.key[:n], child.value[:n], parent)
        upper.lock_ref = child.lock_ref
        upper.last_access = child.last_access
        upper.children[int(child.key[n])] = child
        parent.children[int(child.key[0])] = upper
        child.key = child.key[n:]
        child.value = child.value[n:]
        child.parent = upper
        return upper

    # -- locks ---------------------------------------------------------------------------------
    def inc_lock_ref(self, node: TreeNode | None) -> None:
        while node is not None and node is not self.root:
            if node.lock_ref == 0:
                self._evictable -= len(node.key)
                self._protected += len(node.key)
            node.lock_ref += 1
            node = node.parent

    def dec_lock_ref(self, node: TreeNode | None) -> None:
        while node is not None and node is not self.root:
            if node.lock_ref <= 0:
                raise AssertionError(f"unbalanced unlock of {node}")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._evictable += len(node.key)
                self._protected -= len(node.key)
            node = node.parent

    # -- eviction ------------------------------------------------------------------------------
    def evict(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` slots from unlocked leaves, LRU first (fewer when not
        enough is evictable). Returns the number freed."""
        if num_tokens <= 0:
            return 0
        heap = [(n.last_access, n.id, n) for n in self._leaves() if n.lock_ref == 0]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            _, _, node = heapq.heappop(heap)
            self.allocator.free(node.value)
            freed += len(node.value)
            self._evictable -= len(node.key)
            parent = node.parent
            assert parent is not None                   # evictable nodes are never the root
            del parent.children[int(node.key[0])]
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, parent.id, parent))
        return freed

    def _leaves(self) -> list[TreeNode]:
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            elif node is not self.root:
                out.append(node)
        return out

    def all_values(self) -> np.ndarray:
        vals, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            vals.append(node.value)
            stack.extend(node.children.values())
        return np.concatenate(vals) if vals else _EMPTY

    def locked_nodes(self) -> list[TreeNode]:
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            if node.lock_ref:
                out.append(node)
            stack.extend(node.children.values())
        return out

    # -- request hooks ---------------------------------------------------------------------------
    def cache_finished_req(self, req: Req) -> None:
        """Insert a finished (or aborted/retracted) request's KV into the tree, free its duplicate
        and extra slots, unlock its prefix and free its row.

        NOTE: only the first ``seq_len - 1`` tokens are cached — the KV of the last sampled token
        exists only when the overlap loop ran one step past the finish; that extra slot is freed.
        """
        row = req.req_pool_idx
        if row is None:
            return
        slots = self.req_to_token.slots(row, 0, req.kv_len)
        keep = max(min(req.kv_len, req.seq_len - 1), req.prefix_len)
        new_prefix = self.insert(req.fill_ids[:keep], slots[:keep])
        self.allocator.free(slots[req.prefix_len:new_prefix])
        self.allocator.free(slots[keep:])
        self.dec_lock_ref(req.last_node)
        self.req_to_token.free(row)
        req.req_pool_idx = None
        req.last_node = None

    def cache_unfinished_req(self, req: Req) -> None:
        """Insert a still-running request's KV (e.g. a prefilled chunk) and re-point it at the
        tree: its row now reads the shared slots and its lock moves to the new deepest node."""
        row = req.req_pool_idx
        n = min(req.kv_len, req.seq_len - 1)     # the last sampled token's KV may not exist yet
        if row is None or n <= req.prefix_len:
            return
        tokens = req.fill_ids[:n]
        slots = self.req_to_token.slots(row, 0, n)
        new_prefix = self.insert(tokens, slots)
        self.allocator.free(slots[req.prefix_len:new_prefix])
        match = self.match_prefix(tokens)
        assert match.length == n, (match.length, n)
        if new_prefix > req.prefix_len:   # our duplicates were freed: read the tree's slots
            self.req_to_token.write(row, req.prefix_len, match.indices[req.prefix_len:new_prefix])
        self.inc_lock_ref(match.last_node)
        self.dec_lock_ref(req.last_node)
        req.last_node = match.last_node
        req.prefix_len = n

    def release_req(self, req: Req) -> None:
        """Free a request's private slots and row without caching them (retraction)."""
        row = req.req_pool_idx
        if row is None:
            return
        self.allocator.free(self.req_to_token.slots(row, req.prefix_len, req.kv_len))
        self.dec_lock_ref(req.last_node)
        self.req_to_token.free(row)
        req.req_pool_idx = None
        req.last_node = None

    def pretty(self) -> str:
        lines: list[str] = []

        def walk(node: TreeNode, depth: int) -> None:
            for child in node.children.values():
                lines.append(f"{'  ' * depth}{child.key[:8].tolist()}{'…' if len(child.key) > 8 else ''}"
                             f" len={len(child.key)} lock={child.lock_ref} t={child.last_access}")
                walk(child, depth + 1)

        walk(self.root, 0)
        return "\n".join(lines)
