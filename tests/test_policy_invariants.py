"""Random event sequences against RetentionPolicy's invariants (hypothesis).

The model plays the adapter: it applies each action list Holds first, then
Releases, to per-block reference counts, and checks after every event that the
policy's accounting matches, budgets hold and every Hold gets one Release.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from server_ext.policy import (
    Action,
    BranchHints,
    BranchKey,
    EndEvent,
    Event,
    ForkEvent,
    Hold,
    PolicyConfig,
    Release,
    RetentionPolicy,
    ToolEndEvent,
    ToolStartEvent,
)

TENANTS = st.sampled_from(["A", "B"])
SIDS = st.sampled_from(["s1", "s1", "s2"])
BRANCHES = st.sampled_from(["root", "a", "b"])
MAYBE_BRANCH = st.none() | BRANCHES
SECONDS = st.floats(min_value=0.0, max_value=100.0) | st.floats(min_value=0.0, max_value=2000.0)
BLOCKS = st.lists(st.integers(min_value=0, max_value=20), max_size=10)
HINTS = st.builds(
    BranchHints,
    gap=st.none() | SECONDS,
    ttl=st.none()
    | st.integers(min_value=0, max_value=60)
    | st.integers(min_value=0, max_value=2000),
    end=st.sampled_from([False, False, False, True]),
    prio=st.integers(min_value=0, max_value=7),
    pbr=MAYBE_BRANCH,
    tool=st.none() | st.sampled_from(["bash", "grep"]),
)
EVENTS: st.SearchStrategy[Event] = st.one_of(
    st.builds(
        ToolStartEvent,
        tool=st.sampled_from(["bash", "grep"]),
        br=MAYBE_BRANCH,
        eta=st.none() | SECONDS,
    ),
    st.builds(ToolEndEvent, br=MAYBE_BRANCH),
    st.builds(ForkEvent, children=st.lists(BRANCHES, max_size=3).map(tuple), parent=MAYBE_BRANCH),
    st.builds(EndEvent, br=MAYBE_BRANCH),
)
CONFIG = PolicyConfig(total_blocks=30, ttl_cap_s=600.0)  # global cap 15, tenant cap 7


class PolicyMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.policy = RetentionPolicy(CONFIG, clock=lambda: self.now)
        self.refs: Counter[int] = Counter()
        self.holds: Counter[tuple[BranchKey, tuple[int, ...]]] = Counter()

    def apply(self, actions: list[Action]) -> None:
        for a in actions:
            if isinstance(a, Hold):
                self.holds[(a.key, a.block_ids)] += 1
                self.refs.update(a.block_ids)
        for a in actions:
            if isinstance(a, Release):
                assert self.holds[(a.key, a.block_ids)] > 0, a
                self.holds[(a.key, a.block_ids)] -= 1
                self.refs.subtract(a.block_ids)
                assert min(self.refs.values(), default=0) >= 0

    def held(self, tenant: str | None = None) -> set[int]:
        return {
            b
            for (k, blocks), n in self.holds.items()
            if n and tenant in (None, k.tenant)
            for b in blocks
        }

    @rule(dt=st.sampled_from([1.0, 6.0, 30.0, 100.0, 700.0]) | st.floats(0.0, 120.0))
    def advance(self, dt: float) -> None:
        self.now += dt

    @rule(
        tenant=TENANTS, sid=SIDS, br=BRANCHES, blocks=BLOCKS, hints=HINTS, tool_calls=st.booleans()
    )
    def finish(
        self,
        tenant: str,
        sid: str,
        br: str,
        blocks: list[int],
        hints: BranchHints,
        tool_calls: bool,
    ) -> None:
        key = BranchKey(tenant, sid, br)
        self.apply(self.policy.on_request_finished(key, blocks, hints, tool_calls).actions)

    def pick_key(self, data: st.DataObject) -> BranchKey:
        """Mostly a retained branch, so that events hit something."""
        retained = sorted((r.key for r in self.policy.retentions()), key=str)
        prefer_retained = data.draw(st.booleans())
        if retained and prefer_retained:
            return data.draw(st.sampled_from(retained))
        return data.draw(st.builds(BranchKey, TENANTS, SIDS, BRANCHES))

    @rule(data=st.data())
    def start(self, data: st.DataObject) -> None:
        key = self.pick_key(data)
        self.apply(self.policy.on_request_started(key))
        assert self.policy.retention(key) is None

    @rule(data=st.data(), event=EVENTS)
    def control(self, data: st.DataObject, event: Event) -> None:
        tenant, sid = (key := self.pick_key(data)).tenant, key.sid
        others = {k: n for k, n in self.holds.items() if n and k[0].tenant != tenant}
        self.apply(self.policy.on_control(tenant, sid, event).actions)
        assert {k: n for k, n in self.holds.items() if n and k[0].tenant != tenant} == others

    @rule()
    def expire(self) -> None:
        due = {r.key for r in self.policy.retentions() if r.effective_deadline <= self.now}
        actions = self.policy.expire()
        self.apply(actions)
        assert {a.key for a in actions} == due

    @rule(need=st.integers(min_value=0, max_value=4))
    def make_room(self, need: int) -> None:
        before = len(self.held())
        self.apply(self.policy.make_room(need))
        assert before - len(self.held()) >= need or self.policy.retained_branches == 0

    @precondition(lambda self: self.policy.retained_branches > 0)
    @rule(roll=st.integers(min_value=0, max_value=9))
    def reset(self, roll: int) -> None:
        if roll:  # rare: it wipes the state the other rules build up
            return
        self.apply(self.policy.release_all())
        assert +self.holds == Counter()

    @invariant()
    def accounting_matches_the_adapter(self) -> None:
        p = self.policy
        assert p.held_blocks == len(self.held()) == sum(1 for n in self.refs.values() if n)
        assert p.retained_branches == sum(self.holds.values())
        live = Counter(k for (k, _), n in self.holds.items() for _ in range(n))
        assert all(n == 1 for n in live.values())
        for r in p.retentions():
            assert self.holds[(r.key, r.block_ids)] == 1
            assert r.retained_at <= r.deadline <= r.horizon <= r.retained_at + CONFIG.ttl_cap_s

    @invariant()
    def never_over_budget(self) -> None:
        assert self.policy.held_blocks <= CONFIG.held_cap
        for tenant in "AB":
            assert self.policy.tenant_held_blocks(tenant) == len(self.held(tenant))
            assert len(self.held(tenant)) <= CONFIG.tenant_cap

    def teardown(self) -> None:
        self.apply(self.policy.release_all())
        assert +self.holds == Counter() and +self.refs == Counter()
        assert self.policy.held_blocks == 0


PolicyMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_policy_invariants = PolicyMachine.TestCase
