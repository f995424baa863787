"""``hint_scope`` and threads: a plain executor's calls leave the scope behind (and the
warning says what to use), ``ContextThreadPoolExecutor``'s carry it."""

from __future__ import annotations

import warnings
from concurrent.futures import ThreadPoolExecutor

import pytest

from agentsdk import ContextThreadPoolExecutor, HintedOpenAI, NoSessionWarning, hint_scope

from recording_server import recording_server

HINT = "agent-hints"


def _ask(client: HintedOpenAI) -> None:
    client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])


@pytest.mark.parametrize("executor", [ThreadPoolExecutor, ContextThreadPoolExecutor])
def test_calls_made_in_threads_inside_a_scope(executor: type[ThreadPoolExecutor]) -> None:
    with (
        recording_server() as server,
        HintedOpenAI(base_url=server.base_url, api_key="k") as client,
    ):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with hint_scope(session="task-42", gap=8.0), executor(3) as pool:
                list(pool.map(lambda _: _ask(client), range(3)))
                pool.submit(_ask, client).result()
        client.close()
        carried = [HINT in r.headers for r in server.chats]
    if executor is ContextThreadPoolExecutor:
        assert carried == [True] * 4
        assert all(h["sid"] == "task-42" for h in server.hints())
        assert not [w for w in caught if w.category is NoSessionWarning]
    else:
        assert carried == [False] * 4
        [warning] = [w for w in caught if w.category is NoSessionWarning]
        assert "ContextThreadPoolExecutor" in str(warning.message)
