"""The Prefetcher over a fake downstream ASGI app: what it sends, and when it holds back."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from types import SimpleNamespace
from typing import Any

import pytest

from hints_spec import USER_TOOL, AgentHints
from hints_spec.core import EndEvent, ToolStartEvent
from server_ext import AgentHintsMiddleware, ExtensionConfig, ExtensionConfigError
from server_ext.__main__ import main as serve_main
from server_ext._contract import PREFETCH_KEY, hint_params
from server_ext._prefetch import EARLY_RETURNS, PREFETCHES, Branch, Prefetcher
from server_ext.policy import BranchKey, PrefetchPlanner
from server_ext.testing import FakeDownstream, ManualClock, Received

Message = dict[str, Any]
KEY = BranchKey("default", "s1", "root")


class Downstream(FakeDownstream):
    """Holds real requests at ``gate`` (before any response) and ``tail_gate``
    (after the first body chunk, as while a stream decodes), warm-ups at
    ``warm_gate``."""

    def __init__(self) -> None:
        super().__init__(
            chunks=[b'{"usage":{"prompt_tokens":300}}'], hold=self._hold, tail=self._tail
        )
        self.gate: asyncio.Event | None = None
        self.warm_gate: asyncio.Event | None = None
        self.tail_gate: asyncio.Event | None = None

    def _hold(self, received: Received) -> asyncio.Event | None:
        assert b"content-length" in received.headers
        return self.warm_gate if _warmup(received) else self.gate

    def _tail(self, received: Received) -> asyncio.Event | None:
        return None if _warmup(received) else self.tail_gate

    @property
    def warmups(self) -> list[dict[str, Any]]:
        return [r.json() for r in self.requests if _warmup(r)]


def _warmup(received: Received) -> bool:
    return bool(received.json().get("kv_transfer_params", {}).get(PREFETCH_KEY))


def counts() -> dict[str, float]:
    return {
        r: PREFETCHES.labels(r)._value.get()
        for r in ("issued", "completed", "cancelled", "skipped", "failed")
    }


def delta(before: dict[str, float]) -> dict[str, float]:
    return {k: v - before[k] for k, v in counts().items() if v != before[k]}


def lowered(path: str = "/v1/completions", gap: float | None = 10.0, **extra: object) -> bytes:
    body: dict[str, object] = {"model": "m", "prompt": [1, 2, 3], "max_tokens": 50, **extra}
    body["kv_transfer_params"] = hint_params(KEY.tenant, AgentHints(sid=KEY.sid, gap=gap))
    return json.dumps(body).encode()


async def request(
    prefetcher: Prefetcher,
    body: bytes,
    branch: Branch | None,
    path: str = "/v1/completions",
) -> None:
    scope = {
        "type": "http",
        "method": "POST",
        "path": path,
        "headers": [
            (b"authorization", b"Bearer k"),
            (b"x-request-id", b"r1"),
            (b"content-length", str(len(body)).encode()),
        ],
    }
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if sent:
            await asyncio.Event().wait()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: Message) -> None:
        return None

    await prefetcher.serve(scope, body, branch, receive, send)


def run(
    test: Callable[[Prefetcher, Downstream, ManualClock], Coroutine[Any, Any, None]],
    timeout_s: float = 60.0,
) -> None:
    async def main() -> None:
        clock = ManualClock()
        app = Downstream()
        planner = PrefetchPlanner(clock=clock, margin_s=0.5, seconds_per_token=0.001)
        prefetcher = Prefetcher(  # tests call step()
            app, planner, clock=clock, interval_s=3600, timeout_s=timeout_s
        )
        try:
            await test(prefetcher, app, clock)
        finally:
            await prefetcher.aclose()

    asyncio.run(main())


BRANCH = Branch(KEY, 10.0, False)


def test_warmup_replays_the_last_request_as_one_token() -> None:
    async def scenario(p: Prefetcher, app: Downstream, clock: ManualClock) -> None:
        before = counts()
        body = lowered(
            stream=True, stream_options={"include_usage": True}, min_tokens=5, request_id="r1"
        )
        await request(p, body, BRANCH)
        clock.now = 9.0  # warm at 10 - (0.3 + 0.5)
        await p.step()
        assert app.warmups == []
        clock.now = 9.3
        await p.step()
        [first_request, warm_request] = app.requests
        first, warm = first_request.json(), warm_request.json()
        path, headers = warm_request.path, warm_request.headers
        assert path == "/v1/completions" and headers[b"authorization"] == b"Bearer k"
        assert b"x-request-id" not in headers  # vLLM would reuse it as the request id
        assert warm["max_tokens"] == 1 and warm["stream"] is False
        assert not {"stream_options", "min_tokens", "request_id"} & set(warm)
        assert warm["prompt"] == first["prompt"]
        assert warm["kv_transfer_params"][PREFETCH_KEY] is True
        assert PREFETCH_KEY not in first["kv_transfer_params"]
        assert delta(before) == {"issued": 1, "completed": 1}
        # Measured (0 s on the fake clock): the lead time shrinks.
        assert p.planner.lead_time(1000) < 1.5
        clock.now = 20.0
        await p.step()
        assert len(app.warmups) == 1  # once per departure

    run(scenario)


@pytest.mark.parametrize(
    ("path", "extra", "field"),
    [
        ("/v1/chat/completions", {"max_completion_tokens": 64}, "max_completion_tokens"),
        ("/v1/responses", {}, "max_output_tokens"),
    ],
)
def test_output_limit_field_per_endpoint(path: str, extra: dict[str, object], field: str) -> None:
    async def scenario(p: Prefetcher, app: Downstream, clock: ManualClock) -> None:
        body = json.loads(lowered(**extra))
        del body["max_tokens"]
        await request(p, json.dumps(body).encode(), BRANCH, path)
        clock.now = 9.5
        await p.step()
        [warm] = app.warmups
        assert warm[field] == 1
        assert ("store" in warm) == (path == "/v1/responses")

    run(scenario)


def test_no_warmup_while_a_real_request_prefills_but_beside_its_decode() -> None:
    async def scenario(p: Prefetcher, app: Downstream, clock: ManualClock) -> None:
        await request(p, lowered(), BRANCH)
        app.gate, app.tail_gate = asyncio.Event(), asyncio.Event()
        other = asyncio.create_task(request(p, lowered(), None))  # unhinted, still work
        await asyncio.sleep(0)
        assert p.prefilling == 1
        clock.now = 9.5
        await p.step()
        await p.step()
        assert app.warmups == []
        app.gate.set()  # its first bytes: it decodes now
        await asyncio.sleep(0)
        assert p.prefilling == 0
        await p.step()
        assert len(app.warmups) == 1
        app.tail_gate.set()
        await other
        assert p.prefilling == 0

    run(scenario)


@pytest.mark.parametrize("how", ["returns", "ends"])
def test_a_running_warmup_is_cancelled_when_its_branch_returns_or_ends(how: str) -> None:
    async def scenario(p: Prefetcher, app: Downstream, clock: ManualClock) -> None:
        before = counts()
        await request(p, lowered(), BRANCH)
        clock.now = 1.0
        await request(p, lowered(), Branch(BranchKey(KEY.tenant, "s2"), 10.0, False))
        app.warm_gate = asyncio.Event()  # warm-ups stay queued in the engine
        clock.now = 9.5
        step = asyncio.create_task(p.step())
        await asyncio.sleep(0.01)
        assert len(app.warmups) == 1  # of s1: s2 is due back later
        await request(p, lowered(), Branch(BranchKey(KEY.tenant, "s2"), 10.0, False))
        assert not step.done()  # another branch's return leaves it running
        if how == "returns":
            await request(p, lowered(), BRANCH)
        else:
            p.control(KEY.tenant, KEY.sid, [EndEvent()])
        await asyncio.wait_for(step, 1.0)
        await asyncio.sleep(0)
        assert app.cancelled == 1
        assert delta(before) == {"issued": 1, "cancelled": 1}

    run(scenario)


def test_a_warmup_past_its_timeout_is_aborted_and_counted_failed() -> None:
    async def scenario(p: Prefetcher, app: Downstream, clock: ManualClock) -> None:
        before = counts()
        await request(p, lowered(), BRANCH)
        app.warm_gate = asyncio.Event()  # never admitted
        clock.now = 9.5
        await asyncio.wait_for(p.step(), 1.0)
        await asyncio.sleep(0)
        assert app.cancelled == 1
        assert delta(before) == {"issued": 1, "failed": 1}

    run(scenario, timeout_s=0.05)


def test_return_cancels_a_pending_warmup() -> None:
    async def scenario(p: Prefetcher, app: Downstream, clock: ManualClock) -> None:
        before = counts()
        await request(p, lowered(), BRANCH)
        clock.now = 3.0
        await request(p, lowered(), BRANCH)  # back early: re-planned from now
        app.gate = asyncio.Event()
        busy = asyncio.create_task(request(p, lowered(), None))
        await asyncio.sleep(0)
        clock.now = 12.5
        await p.step()  # due, but the engine is busy: queued
        gate, app.gate = app.gate, None
        await request(p, lowered(), BRANCH)  # the branch returns while queued
        gate.set()
        await busy
        await p.step()
        assert app.warmups == []
        assert delta(before) == {"cancelled": 1}
        stats = p.planner.stats
        assert (stats.returns, stats.early_returns) == (2, 1)
        assert EARLY_RETURNS._value.get() == 0.5

    run(scenario)


def test_end_cancels_by_hint_and_by_control_event() -> None:
    async def scenario(p: Prefetcher, app: Downstream, clock: ManualClock) -> None:
        await request(p, lowered(), BRANCH)
        p.control(KEY.tenant, KEY.sid, [EndEvent()])
        other = BranchKey(KEY.tenant, "s2")
        await request(p, lowered(), Branch(other, 10.0, False))
        await request(p, lowered(), Branch(other, None, True))  # the end hint
        clock.now = 100.0
        await p.step()
        assert app.warmups == []
        assert p.planner.stats.tracked == 0

    run(scenario)


def test_tool_start_eta_moves_the_warmup_and_late_ones_are_skipped() -> None:
    async def scenario(p: Prefetcher, app: Downstream, clock: ManualClock) -> None:
        before = counts()
        await request(p, lowered(), BRANCH)
        p.control(KEY.tenant, KEY.sid, [ToolStartEvent(tool="build", eta=60)])
        clock.now = 30.0
        await p.step()
        assert app.warmups == []
        app.gate = asyncio.Event()
        busy = asyncio.create_task(request(p, lowered(), None))
        await asyncio.sleep(0)
        clock.now = 59.5
        await p.step()  # due but busy ...
        clock.now = 1000.0  # ... until far past its return window
        app.gate.set()
        await busy
        await p.step()
        assert app.warmups == []
        assert delta(before) == {"skipped": 1}

    run(scenario)


def test_a_wait_on_the_user_is_not_warmed() -> None:
    async def scenario(p: Prefetcher, app: Downstream, clock: ManualClock) -> None:
        await request(p, lowered(), BRANCH)
        p.control(KEY.tenant, KEY.sid, [ToolStartEvent(tool=USER_TOOL, eta=60)])
        for clock.now in (30.0, 59.5, 61.0):
            await p.step()
        assert app.warmups == []
        assert p.planner.stats.tracked == 1  # still planned: its return is learned

    run(scenario)


def test_failed_requests_and_unhinted_bodies_plan_nothing() -> None:
    async def scenario(p: Prefetcher, app: Downstream, clock: ManualClock) -> None:
        await request(p, b'{"model": "m", "prompt": "x"}', None)
        assert p.planner.stats.tracked == 0

    run(scenario)


def test_middleware_owns_a_prefetcher_when_enabled() -> None:
    """Wiring, in real time: hints in, a warm-up out, control events through."""

    async def main() -> None:
        app = Downstream()
        transfer = SimpleNamespace(
            kv_connector="AgentHintsConnector", kv_connector_extra_config={"prefetch": True}
        )
        engine = SimpleNamespace(notify_kv_transfer_request_rejected=_noop)
        state = SimpleNamespace(
            vllm_config=SimpleNamespace(kv_transfer_config=transfer), engine_client=engine
        )
        middleware = AgentHintsMiddleware(app)

        async def call(path: str, payload: object, hints: str | None = None) -> None:
            body = json.dumps(payload).encode()
            headers = [(b"content-length", str(len(body)).encode())]
            if hints is not None:
                headers.append((b"agent-hints", hints.encode()))
            scope = {
                "type": "http",
                "method": "POST",
                "path": path,
                "headers": headers,
                "app": SimpleNamespace(state=state),
            }
            chunks = [body]

            async def receive() -> Message:
                return {"type": "http.request", "body": chunks.pop() if chunks else b""}

            async def send(message: Message) -> None:
                return None

            await middleware(scope, receive, send)

        prompt = {"model": "m", "prompt": [1, 2], "max_tokens": 9}
        await call("/v1/completions", prompt, 'v=1, sid="w", gap=0.1')
        prefetcher = middleware.prefetcher
        assert prefetcher is not None
        for _ in range(50):
            if app.warmups:
                break
            await asyncio.sleep(0.05)
        [warm] = app.warmups
        assert warm["max_tokens"] == 1 and warm["session_id"] == "w"
        # A second session, ended by a control event before its warm-up.
        await call("/v1/completions", prompt, 'v=1, sid="x", gap=5')
        await call("/v1/agent-hints/events", {"v": 1, "sid": "x", "events": [{"type": "end"}]})
        assert prefetcher.planner.stats.tracked == 1  # "w" only, until it returns
        await prefetcher.aclose()

    asyncio.run(main())


async def _noop(*args: object, **kwargs: object) -> None:
    return None


def test_enabled_by_the_extension_config_or_the_serve_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert ExtensionConfig.from_mapping({}).prefetch is False
    assert ExtensionConfig.from_mapping({"prefetch": True}).prefetch is True
    with pytest.raises(ExtensionConfigError, match="prefetch"):
        ExtensionConfig.from_mapping({"prefetch": "yes"})
    assert serve_main(["serve", "m", "--prefetch", "--print-command"]) == 0
    assert '"prefetch": true' in capsys.readouterr().out


def test_the_minimum_accuracy_reaches_the_policy_and_is_checked(
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = ExtensionConfig.from_mapping({"prefetch_min_accuracy": 0.25})
    assert config.policy_config(100).prefetch_min_accuracy == 0.25
    assert ExtensionConfig().policy_config(100).prefetch_min_accuracy == 0.5
    with pytest.raises(ExtensionConfigError, match="prefetch_min_accuracy"):
        ExtensionConfig.from_mapping({"prefetch_min_accuracy": 1.5}).policy_config(100)
    assert serve_main(["serve", "m", "--prefetch-min-accuracy", "0", "--print-command"]) == 0
    assert '"prefetch_min_accuracy": 0.0' in capsys.readouterr().out
