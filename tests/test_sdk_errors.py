"""The errors a newcomer meets name the fix: the URL and status of a failed model call,
the agent and setting behind MaxTurnsExceeded, the async alternative of run_sync, a
failing tool in the developer's log, and warnings on the user's own line."""

from __future__ import annotations

import logging
import socket
import warnings

import pytest

from agentsdk import (
    Agent,
    HintedAsyncOpenAI,
    MaxTurnsExceeded,
    ModelCallError,
    NoSessionWarning,
    Runner,
    ScriptedCall,
    ScriptedModel,
    UserError,
    tool,
)

from recording_server import recording_server

pytestmark = pytest.mark.anyio

AGENT = Agent(name="coder", instructions="Code.", model="tiny")


async def test_a_base_url_without_v1_names_the_url_the_status_and_the_fix() -> None:
    with recording_server() as server:
        root = server.base_url.removesuffix("/v1")
        async with HintedAsyncOpenAI(base_url=root, api_key="k", max_retries=0) as client:
            with pytest.raises(ModelCallError) as caught:
                await Runner.run(AGENT, "hi", client=client)
    error = caught.value
    assert (error.status, error.url) == (404, f"{root}/chat/completions")
    assert f"to {root}/chat/completions failed: HTTP 404" in str(error)
    assert f"did you mean base_url={root}/v1?" in str(error)


async def test_a_dead_server_names_its_url() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    async with HintedAsyncOpenAI(base_url=url, api_key="k", max_retries=0) as client:
        with pytest.raises(ModelCallError, match="cannot connect") as caught:
            await Runner.run(AGENT, "hi", client=client)
    assert f"to {url}/chat/completions" in str(caught.value) and caught.value.status is None
    assert "base_url" in str(caught.value)


@tool
def again() -> str:
    """Do it again."""
    return "more"


@tool
def broken() -> str:
    """Fail."""
    raise OSError("disk full")


async def test_max_turns_exceeded_names_the_agent_and_the_setting() -> None:
    looping = Agent(name="looper", model="tiny", tools=[again])
    model = ScriptedModel([[ScriptedCall("again")]] * 3)
    with pytest.raises(MaxTurnsExceeded, match=r"agent 'looper' .* max_turns=2.*max_turns=\.\.\."):
        await Runner.run(looping, "go", client=model, max_turns=2)


async def test_run_sync_in_a_running_loop_names_the_async_call() -> None:
    with pytest.raises(UserError, match=r"running event loop.*await Runner\.run"):
        Runner.run_sync(AGENT, "hi", client=ScriptedModel(["hi"]))


async def test_a_failing_tool_is_logged_for_the_developer(caplog: pytest.LogCaptureFixture) -> None:
    agent = Agent(name="coder", model="tiny", tools=[broken])
    model = ScriptedModel([[ScriptedCall("broken")], "sorry"])
    with caplog.at_level(logging.WARNING, logger="agentsdk"):
        await Runner.run(agent, "go", client=model)
    [record] = [r for r in caplog.records if "broken" in r.getMessage()]
    assert "agent 'coder'" in record.getMessage() and "disk full" in record.getMessage()
    assert record.exc_info is not None and isinstance(record.exc_info[1], OSError)


async def test_warnings_point_at_the_users_line() -> None:
    with recording_server() as server:
        async with HintedAsyncOpenAI(base_url=server.base_url, api_key="k") as client:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                await client.chat.completions.create(model="tiny", messages=[])
    [warning] = [w for w in caught if w.category is NoSessionWarning]
    assert warning.filename == __file__
