"""The event loop, the router, the clients, and one run of one configuration.

Sessions arrive as a Poisson process; each replays its template as the
benchmarks' replay client does (``benchmarks._replay``): a branch sends a
request, waits for its response, waits its paced think time, sends the
next; a fork runs its sub-agents at once and the parent resumes after the
last. A hinted client sends what ``_replay`` sends: the session, branch and
parent, a ``gap`` that is the median of the gaps it has seen, ``end`` on a
sub-agent's last request, a ``tool_start`` for the user when a turn ends
(``turns``), and with ``tools`` also ``tool_start``/``tool_end`` around
every tool wait, as the SDK's agent loop posts them.

The router picks an instance per request: ``sticky`` hashes the session id
on a ring of virtual nodes (vllm-router's consistent hashing on
``X-Session-ID``), ``load`` takes the instance with the fewest requests in
flight. Control messages go where the session's last request went.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import heapq
import itertools
import operator
import random
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Literal

from hints_spec import USER_TOOL, AgentHints
from hints_spec.core import Event, ToolEndEvent, ToolStartEvent
from server_ext._config import ExtensionConfig
from server_ext._contract import control_params, hint_params
from server_ext._engine import EngineRetention
from server_ext._tenant import DEFAULT_TENANT
from server_ext.policy import RetentionPolicy

from .._replay import PastGaps
from ._cache import DevicePool, PoolPort
from ._engine import Engine, Request
from ._model import Preset
from ._tier import Tier
from ._workload import Keys, SimBranch, SimFork, SimRequest, Template

__all__ = ["CONFIGS", "Cluster", "Record", "RunSpec", "run"]

CONFIGS = ("plain", "hint-free", "extension", "belady", "unlimited")
"""plain vLLM (LRU, no tier); vLLM's offloading with LRU at the tier's bytes
(hint-free); the extension at its defaults (retention, the hinted tier);
Belady's rule over the device and the tier's blocks together, loads free;
a device cache with room for everything."""

ControlStyle = Literal["none", "turns", "tools"]

_SHARED_BELOW = 1 << 40
"""Keys of namespace 0: a model's system prefix, shared by its sessions."""


@dataclass(frozen=True, slots=True)
class RunSpec:
    """What one simulation runs (every configuration the same)."""

    preset: Preset
    instances: int = 1
    router: Literal["sticky", "load"] = "sticky"
    pool_bytes: int = 0
    """The shared pool (0: none), all instances together."""
    rate: float = 0.0
    """Session arrivals per second (Poisson); 0: all at once."""
    sessions: int = 0
    """Sessions to run (templates replayed round-robin); 0: each template once."""
    control: ControlStyle = "turns"
    unhinted: frozenset[str] = frozenset()
    """Sessions whose client sends no hints (mixed traffic)."""
    seed: int = 0
    prior_gap_s: float = 10.0
    """The hinted client's gap before it has seen one (``_replay``'s 10 s, paced)."""
    prior_user_wait_s: float = 60.0


@dataclass(slots=True)
class Record:
    """One request's outcome."""

    session: str
    sent: float
    prompt_tokens: int
    cached_tokens: int
    theoretical: int
    ttft_s: float = 0.0
    done: float = 0.0


class Cluster:
    """The clock, the event heap and the instances of one configuration."""

    def __init__(self, spec: RunSpec, config: str) -> None:
        self.spec = spec
        self.config = config
        self.now = 0.0
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        preset = spec.preset
        self.pool: Tier | None = None
        if spec.pool_bytes and config in ("hint-free", "extension"):
            self.pool = Tier(spec.pool_bytes // preset.kv_block_bytes, "lru", self.clock)
        self.engines = [self._engine(i) for i in range(spec.instances)]
        self._ring = _ring(spec.instances)

    def clock(self) -> float:
        return self.now

    def _engine(self, i: int) -> Engine:
        preset, config = self.spec.preset, self.config
        blocks = preset.device_blocks
        order: Callable[[int], float] | None = None
        if config == "unlimited":
            blocks = 1 << 40
        elif config == "belady":
            blocks += preset.host_tier_blocks
            order = self._next_use
        pool = DevicePool(blocks, order)
        tier = None
        if config in ("hint-free", "extension") and preset.host_tier_blocks > 0:
            tier = Tier(
                preset.host_tier_blocks, "hints" if config == "extension" else "lru", self.clock
            )
        retention = None
        if config == "extension":
            ext = ExtensionConfig()
            policy = RetentionPolicy(ext.policy_config(preset.device_blocks), clock=self.clock)
            retention = EngineRetention(policy, PoolPort(pool), None, clock=self.clock)
        return Engine(self, i, preset, pool, tier, retention)

    # -- Belady's clock: when a block is next used, as recorded

    next_use: dict[int, float]

    def _next_use(self, key: int) -> float:
        return -self.next_use.get(key, float("inf"))

    # -- events

    def at(self, t: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self._events, (t, next(self._seq), fn))

    def run(self) -> None:
        events = self._events
        while events:
            t, _, fn = heapq.heappop(events)
            self.now = t
            fn()

    def route(self, sid: str) -> Engine:
        if self.spec.router == "load" and len(self.engines) > 1:
            return min(self.engines, key=lambda e: (e.outstanding, e.index))
        h = int.from_bytes(hashlib.blake2b(sid.encode(), digest_size=8).digest(), "big")
        points, owners = self._ring
        i = bisect.bisect(points, h) % len(points)
        return self.engines[owners[i]]


def _ring(n: int, vnodes: int = 160) -> tuple[list[int], list[int]]:
    """A consistent-hash ring of ``n`` instances (``vnodes`` points each)."""
    entries = sorted(
        (int.from_bytes(hashlib.blake2b(f"{i}-{v}".encode(), digest_size=8).digest(), "big"), i)
        for i in range(n)
        for v in range(vnodes)
    )
    return [p for p, _ in entries], [i for _, i in entries]


@dataclass(slots=True)
class _Send:
    request: SimRequest
    branch: SimBranch
    gap: float


@dataclass(slots=True)
class _Sleep:
    seconds: float


@dataclass(slots=True)
class _Fork:
    fork: SimFork


_Action = _Send | _Sleep | _Fork


@dataclass(slots=True)
class _Session:
    """One session replica in flight."""

    sid: str
    template: Template
    keys: Keys
    hinted: bool
    control: ControlStyle
    gaps: PastGaps
    user_waits: PastGaps
    seen: set[int] = field(default_factory=set)
    engine: Engine | None = None
    branches: int = 0


class _Clients:
    """The sessions' clients (module doc), recording each request."""

    def __init__(self, cluster: Cluster, records: list[Record]) -> None:
        self.cluster = cluster
        self.records = records
        self.spec = cluster.spec
        self._ids = itertools.count()
        self.shared_seen: set[int] = set()

    def start(self, s: _Session) -> None:
        self._run(s, self._branch(s, s.template.root), lambda: None)

    def _run(
        self, s: _Session, gen: Generator[_Action, None, None], then: Callable[[], None]
    ) -> None:
        """Advance a branch's generator until it waits on something."""
        c = self.cluster
        try:
            action = next(gen)
        except StopIteration:
            then()
            return

        def resume() -> None:
            self._run(s, gen, then)

        if isinstance(action, _Sleep):
            c.at(c.now + action.seconds, resume)
        elif isinstance(action, _Fork):
            left = len(action.fork.branches)
            if not left:
                resume()
                return

            def one_done() -> None:
                nonlocal left
                left -= 1
                if left == 0:
                    resume()

            for b in action.fork.branches:
                self._run(s, self._branch(s, b), one_done)
        else:
            self._send(s, action, resume)

    def _branch(self, s: _Session, branch: SimBranch) -> Generator[_Action, None, None]:
        c = self.cluster
        returned: float | None = None
        waited_on = s.gaps
        br = branch.name
        for step in branch.steps:
            if isinstance(step, SimFork):
                yield _Fork(step)
                continue
            if step.wait_s > 0:
                yield _Sleep(step.wait_s)
            if returned is not None:
                waited_on.observe(c.now - returned)
                if waited_on is s.gaps and s.control == "tools":
                    self._control(s, ToolEndEvent(br=br))
            gap = s.gaps.estimate()
            yield _Send(step, branch, gap)
            returned = c.now
            waited_on = s.gaps
            if step.ends_turn and not step.end:
                waited_on = s.user_waits
                if s.control != "none":
                    eta = round(s.user_waits.estimate(), 3)
                    self._control(s, ToolStartEvent(tool=USER_TOOL, br=br, eta=eta))
            elif not step.end and s.control == "tools":
                tool = step.tool or "tool"
                self._control(s, ToolStartEvent(tool=tool, br=br, eta=round(gap, 3)))

    def _control(self, s: _Session, event: Event) -> None:
        if not s.hinted or s.engine is None:
            return
        params = control_params(DEFAULT_TENANT, s.sid, [event])
        s.engine.control(f"ctl-{next(self._ids)}", params)

    def _send(self, s: _Session, action: _Send, resume: Callable[[], None]) -> None:
        c = self.cluster
        step, branch = action.request, action.branch
        B = self.spec.preset.block_tokens
        keys = s.keys.of(step, B)
        limit = (step.prompt_tokens - 1) // B
        # The leading blocks seen before, by this session or (the system
        # prefix) any: counted in C, a prompt is hundreds of blocks.
        ks = keys[:limit] if limit < len(keys) else keys
        mine, shared = map(s.seen.__contains__, ks), map(self.shared_seen.__contains__, ks)
        seen = map(operator.or_, mine, shared)
        theoretical = next(itertools.compress(itertools.count(), map(operator.not_, seen)), len(ks))
        s.seen.update(keys)
        # The system prefix comes first.
        self.shared_seen.update(itertools.takewhile(_SHARED_BELOW.__gt__, keys))
        params = None
        if s.hinted:
            hints = AgentHints(
                sid=s.sid,
                br=branch.name,
                pbr=branch.parent,
                gap=round(action.gap, 3),
                end=step.end,
            )
            params = hint_params(DEFAULT_TENANT, hints)
        record = Record(s.sid, c.now, step.prompt_tokens, 0, theoretical * B)
        self.records.append(record)
        if c.config == "belady":
            self._plan_next_use(s, branch, step, keys)

        def first(t: float) -> None:
            record.ttft_s = t - record.sent
            record.cached_tokens = request.cached

        def done(t: float) -> None:
            record.done = t
            resume()

        request = Request(
            f"{s.sid}-{next(self._ids)}", keys, step.prompt_tokens, step.output_tokens,
            params, first, done,
        )  # fmt: skip
        engine = s.engine = c.route(s.sid)
        engine.submit(request)

    def _plan_next_use(
        self, s: _Session, branch: SimBranch, step: SimRequest, keys: Sequence[int]
    ) -> None:
        """Belady's clock: each block of this prompt is next used when the
        branch's next request would be sent as recorded (never, if that
        request does not have it)."""
        c = self.cluster
        nxt = step.next_in_branch
        use = c.next_use
        n = 0 if nxt is None else nxt.prompt_tokens // self.spec.preset.block_tokens
        if nxt is not None:
            at = c.now + max(nxt.nominal_s - step.nominal_s, 0.0)
            use.update(dict.fromkeys(keys[:n], at))
        for k in keys[n:]:
            use.pop(k, None)


def run(
    spec: RunSpec, config: str, templates: Sequence[Template], hinted: bool
) -> tuple[list[Record], Cluster]:
    """Simulate ``templates`` (``spec.sessions`` of them, round-robin, each
    replica with its own keys) under ``config``."""
    cluster = Cluster(spec, config)
    cluster.next_use = {}
    records: list[Record] = []
    clients = _Clients(cluster, records)
    rng = random.Random(spec.seed)
    n = spec.sessions or len(templates)
    t = 0.0
    preset = spec.preset
    for i in range(n):
        template = templates[i % len(templates)]
        sid = template.session_id if i < len(templates) else f"{template.session_id}~{i}"
        session = _Session(
            sid,
            template,
            Keys(i + 1, _hashes(preset.block_tokens, preset.token_scale, template.hashed)),
            hinted and config == "extension" and template.session_id not in spec.unhinted,
            spec.control,
            PastGaps(spec.prior_gap_s),
            PastGaps(spec.prior_user_wait_s),
        )
        cluster.at(t, functools.partial(clients.start, session))
        if spec.rate > 0:
            t += rng.expovariate(spec.rate)
    cluster.run()
    return records, cluster


def _hashes(block_tokens: int, token_scale: float, hashed: bool) -> int:
    if not hashed:
        return 1
    per = block_tokens / (64 * token_scale)
    return max(int(per), 1)
