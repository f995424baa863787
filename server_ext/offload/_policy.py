"""``AgentHintsCachePolicy``: the hints as the replacement policy of vLLM's
own offloading tier (``CPUOffloadingManager``).

vLLM's manager owns the chunks, their reference counts and the copies; a
``CachePolicy`` decides only which ready chunk goes when room is needed. This
one is vLLM's LRU (recency set by request-scoped accesses, independent of
transfer pinning) with one class in front of it: chunks whose sessions said
they are done. A chunk leaves the tier first when every hinted branch that
used it has ended (an ``end`` hint: the branch, or on the root branch the
whole session) or outlived the ``ttl`` it asked for without coming back,
and no unhinted request used it. Among those, and among the rest, the least
recently used goes first. A request that carries no hint only refreshes
recency, so for traffic without hints the policy *is* LRU (tested against
vLLM's ``LRUCachePolicy``). An ``end`` may also come as a control event (the
extension's control endpoint reaches vLLM's offloading as a request with no
blocks).

Owners are scoped by tenant: one tenant's ``end`` cannot release the chunks
that another tenant's session used.
"""

from __future__ import annotations

import heapq
import itertools
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

from vllm.v1.kv_offload.base import OffloadKey, ReqContext
from vllm.v1.kv_offload.cpu.policies.base import CachePolicy, ChunkStatus

from hints_spec import ROOT_BRANCH, SessionAction
from hints_spec.core import EndEvent

from .._contract import ControlMessage, read_control
from ._hints import session_action

__all__ = ["AgentHintsCachePolicy", "PolicyCounters", "policy_counters"]

_Owner = tuple[str, str, str]
"""(tenant, session, branch) of a hinted request."""

_SHARED = ("", "", "")
"""The owner that stands for unhinted use, and for more owners than a chunk
tracks: such a chunk is never released by a hint, only aged by LRU."""

MAX_OWNERS = 64
"""Owners tracked per chunk; past it the chunk counts as shared (a system
prompt used by every session is not worth a set of them all)."""

DEFAULT_TTL_CAP_S = 600.0
"""No hinted ``ttl`` keeps a branch's chunks ahead of LRU longer than this
(the extension's ``ttl_cap_s`` default)."""


class PolicyCounters:
    """What the policy did (cumulative): branches released by an end and by
    their ttl, chunks moved to the first-to-go class, and those evicted
    from it (each one a chunk LRU would have kept in place of a live one)."""

    __slots__ = ("ended_branches", "expired_branches", "released_chunks", "released_evicted")

    def __init__(self) -> None:
        self.ended_branches = 0
        self.expired_branches = 0
        self.released_chunks = 0
        self.released_evicted = 0


_LIVE: weakref.WeakSet[AgentHintsCachePolicy] = weakref.WeakSet()
"""The policies of this process: vLLM builds them inside its offloading
manager, out of the extension connector's reach, so the connector's metrics
find them here (one engine core per process)."""


def policy_counters() -> dict[str, int] | None:
    """The summed counters of this process's policies, or None without one."""
    live = list(_LIVE)
    if not live:
        return None
    return {name: sum(getattr(p.counters, name) for p in live) for name in PolicyCounters.__slots__}


class _Hinted:
    """A request's session hint, read once (``ReqContext`` state)."""

    __slots__ = ("action",)

    def __init__(self, action: SessionAction | None) -> None:
        self.action = action


class AgentHintsCachePolicy(CachePolicy):
    """LRU with ended and expired sessions' chunks evicted first (module doc).

    Loaded by vLLM's ``CPUOffloadingManager`` from
    ``"eviction_policy": "AgentHintsCachePolicy", "cache_policy_module_path":
    "server_ext.offload"``. ``clock`` and ``ttl_cap_s`` are for tests and
    embedding; vLLM constructs it with the capacity only.
    """

    def __init__(
        self,
        cache_capacity: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        ttl_cap_s: float = DEFAULT_TTL_CAP_S,
    ) -> None:
        super().__init__(cache_capacity)
        self.chunks: dict[OffloadKey, ChunkStatus] = {}
        # Recency, least recent first: live chunks, and released ones (first to go).
        self._live: OrderedDict[OffloadKey, None] = OrderedDict()
        self._released: OrderedDict[OffloadKey, None] = OrderedDict()
        self._evictable: set[OffloadKey] = set()
        self._owners: dict[OffloadKey, set[_Owner]] = {}
        self._branches: dict[_Owner, set[OffloadKey]] = {}
        # (deadline, seq, owner); an entry is current while _deadline[owner] == seq.
        self._deadlines: list[tuple[float, int, _Owner]] = []
        self._deadline: dict[_Owner, int] = {}
        self._seq = itertools.count()
        self._clock = clock
        self._ttl_cap_s = ttl_cap_s
        self.counters = PolicyCounters()
        _LIVE.add(self)

    # -- CachePolicy: storage

    def get(self, key: OffloadKey) -> ChunkStatus | None:
        return self.chunks.get(key)

    def insert(
        self, key: OffloadKey, chunk: ChunkStatus, req_context: ReqContext | None = None
    ) -> None:
        # vLLM 0.32 calls insert(key, chunk); 0.33 adds the request's context.
        self.chunks[key] = chunk
        self._live[key] = None
        self._live.move_to_end(key)
        if chunk.ref_cnt == 0:
            self._evictable.add(key)

    def remove(self, key: OffloadKey) -> None:
        del self.chunks[key]
        self._forget(key)

    def clear(self) -> None:
        self.chunks.clear()
        self._live.clear()
        self._released.clear()
        self._evictable.clear()
        self._owners.clear()
        self._branches.clear()
        self._deadlines.clear()
        self._deadline.clear()

    def mark_evictable(self, key: OffloadKey) -> None:
        self._evictable.add(key)

    def mark_non_evictable(self, key: OffloadKey) -> None:
        self._evictable.discard(key)

    # -- CachePolicy: accesses

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        self._access(list(keys), req_context)

    def on_request_finished(
        self,
        key_groups: Sequence[Sequence[OffloadKey]],
        insertion_only_keys: set[OffloadKey],
        reused_keys: set[OffloadKey],
        req_context: ReqContext,
    ) -> None:
        control = read_control(req_context.kv_transfer_params)
        if control is not None:  # the extension's control message: no blocks
            self._control(control)
            return
        # The manager hands each group head to tail: the head most recent, as
        # vLLM's LRU ranks it (a chain is useless without its first block).
        self._access([key for group in key_groups for key in group], req_context)

    def _access(self, keys: list[OffloadKey], req_context: ReqContext) -> None:
        self._expire()
        action = _hint_of(req_context)
        owner = _SHARED if action is None else _owner_of(action)
        for key in reversed(keys):
            if key not in self.chunks:
                continue
            if key in self._released:
                del self._released[key]
            self._live[key] = None
            self._live.move_to_end(key)
            self._own(key, owner)
        if action is None:
            return
        hints = action.hints
        if hints.end:
            self._end(owner, whole_session=owner[2] == ROOT_BRANCH)
        elif hints.ttl is not None:
            seq = next(self._seq)
            self._deadline[owner] = seq
            deadline = self._clock() + min(float(hints.ttl), self._ttl_cap_s)
            heapq.heappush(self._deadlines, (deadline, seq, owner))

    # -- CachePolicy: eviction

    def evict(
        self, n: int, protected: set[OffloadKey]
    ) -> list[tuple[OffloadKey, ChunkStatus]] | None:
        if n == 0:
            return []
        self._expire()
        chosen: list[OffloadKey] = []
        for order in (self._released, self._live):
            for key in order:
                if len(chosen) == n:
                    break
                if key in self._evictable and key not in protected:
                    chosen.append(key)
        if len(chosen) < n:
            return None  # atomic: nothing changed
        evicted = []
        for key in chosen:
            if key in self._released:
                self.counters.released_evicted += 1
            chunk = self.chunks.pop(key)
            assert chunk.ref_cnt == 0
            self._forget(key)
            evicted.append((key, chunk))
        return evicted

    # -- owners, ends and deadlines

    def _own(self, key: OffloadKey, owner: _Owner) -> None:
        owners = self._owners.setdefault(key, set())
        if _SHARED in owners or owner in owners:
            return
        if owner == _SHARED or len(owners) >= MAX_OWNERS:
            for old in owners:
                self._branch_drop(old, key)
            owners.clear()
            owners.add(_SHARED)
            return
        owners.add(owner)
        self._branches.setdefault(owner, set()).add(key)

    def _branch_drop(self, owner: _Owner, key: OffloadKey) -> None:
        keys = self._branches.get(owner)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._branches[owner]

    def _forget(self, key: OffloadKey) -> None:
        self._live.pop(key, None)
        self._released.pop(key, None)
        self._evictable.discard(key)
        for owner in self._owners.pop(key, ()):
            self._branch_drop(owner, key)

    def _end(self, owner: _Owner, whole_session: bool) -> None:
        if whole_session:
            ended = [o for o in self._branches if o[:2] == owner[:2]]
        else:
            ended = [owner] if owner in self._branches else []
        for branch in ended:
            self.counters.ended_branches += 1
            self._release(branch)

    def _control(self, message: ControlMessage) -> None:
        """``end`` events of a control message (``server_ext._contract``,
        built by the API server for its tenant): as an ``end`` hint."""
        tenant, sid = message.tenant, message.sid
        self._expire()
        for event in message.events:
            if not isinstance(event, EndEvent):
                continue
            if event.br is None or event.br == ROOT_BRANCH:
                self._end((tenant, sid, ROOT_BRANCH), whole_session=True)
            else:
                self._end((tenant, sid, event.br), whole_session=False)

    def _release(self, owner: _Owner) -> None:
        """``owner`` is done: each of its chunks that no other owner holds
        moves to the released class, keeping its recency order."""
        self._deadline.pop(owner, None)
        keys = self._branches.pop(owner, set())
        freed = set()
        for key in keys:
            owners = self._owners[key]
            owners.discard(owner)
            if not owners:
                freed.add(key)
        if not freed:
            return
        # Oldest first, as they stood in LRU order.
        for key in [key for key in self._live if key in freed]:
            del self._live[key]
            self._released[key] = None
            self.counters.released_chunks += 1

    def _expire(self) -> None:
        now = self._clock()
        while self._deadlines and self._deadlines[0][0] <= now:
            _, seq, owner = heapq.heappop(self._deadlines)
            if self._deadline.get(owner) == seq:
                self.counters.expired_branches += 1
                self._release(owner)


def _hint_of(req_context: ReqContext) -> SessionAction | None:
    """The request's session hint, parsed once per request."""
    state = req_context.get_state(_Hinted)
    if state is None:
        state = _Hinted(session_action(req_context.kv_hints, req_context.kv_transfer_params))
        req_context.set_state(state)
    return state.action


def _owner_of(action: SessionAction) -> _Owner:
    hints = action.hints
    return (action.tenant or "", hints.sid or "", hints.br or ROOT_BRANCH)
