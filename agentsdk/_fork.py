"""Forks: sub-agents on child branches (``Runner.fan_out`` and ``Agent.as_tool``).

The parent first sends one ``fork`` event naming every child, delivered before their
first requests, so the server keeps the shared prefix while they run; each child's
``end`` follows it. A forked child renders its parent's tool definitions (its prompt
starts as the parent's) but cannot call the tool that forked it, unless the fork is
``recursive``: so a fan-out does not recurse by accident, and ``RunConfig.max_fork_depth``
/ ``max_model_calls`` bound it when asked to.
"""

from __future__ import annotations

from collections.abc import Sequence

import anyio
from opentelemetry.trace import get_current_span

from hints_spec import (
    MAX_CHILDREN,
    End,
    Fork,
)

from ._agent import Agent
from ._env import DEFAULT_MAX_TURNS, FATAL, Branch, BranchContext, system_prompt, wire
from ._errors import (
    ForkDepthExceeded,
    UserError,
)
from ._items import (
    AgentInput,
    Message,
    input_messages,
)
from ._result import RunResult
from ._stream import (
    ForkEvent,
)
from ._tracing import (
    AGENT_HINTS_FORK_CHILDREN,
)
from ._usage import Usage

__all__ = ["spawn"]


async def spawn(
    parent: BranchContext,
    children: Sequence[tuple[Agent, AgentInput]],
    fork_context: bool,
    max_turns: int | None,
    recursive: bool,
) -> list[RunResult]:
    """Fork ``children`` from ``parent`` (``Runner.fan_out`` and ``Agent.as_tool``)."""
    inputs = _check_children(children)
    env = parent._branch.env
    if parent.depth >= env.config.max_fork_depth:
        raise ForkDepthExceeded(env.config.max_fork_depth, parent.branch)
    branches = [env.new_branch(parent.branch, agent.name) for agent, _ in children]
    get_current_span().set_attribute(AGENT_HINTS_FORK_CHILDREN, branches)
    await env.emit(ForkEvent(parent, parent._branch.agent, branches))
    env.submit(
        [
            Fork(parent=wire(parent.branch), children=branches[i : i + MAX_CHILDREN])
            for i in range(0, len(branches), MAX_CHILDREN)
        ]
    )
    await env.delivered()  # the server learns of the fork before the children's requests
    forker = parent.tool_call.name if parent.tool_call is not None and not recursive else None
    results: list[RunResult | None] = [None] * len(children)
    errors: list[Exception] = []

    async def run_child(index: int) -> None:
        agent, task = children[index][0], inputs[index]
        if fork_context:
            inherited = parent._branch.definitions
            names = {t.name for t in inherited}
            own = tuple(t for t in agent.tools if t.name not in names)
            callable_ = {n: t for n, t in parent._branch.tools.items() if n != forker}
            branch = Branch(agent, (*inherited, *own), callable_ | {t.name: t for t in own}, env)
            prompt, new_input = list(parent.messages), _task(agent.instructions, task)
        else:
            branch = Branch(agent, tuple(agent.tools), {t.name: t for t in agent.tools}, env)
            prompt, new_input = system_prompt(agent.instructions), task
        child = BranchContext(
            context=parent.context,
            agent_name=agent.name,
            model=agent.model or parent.model,
            session_id=parent.session_id,
            branch=branches[index],
            parent_branch=parent.branch,
            depth=parent.depth + 1,
            usage=Usage(),
            _branch=branch,
        )
        try:
            results[index] = await env.run_branch(
                child, prompt, new_input, max_turns or DEFAULT_MAX_TURNS, None
            )
        except Exception as err:
            errors.append(err)
            if isinstance(err, FATAL):
                group.cancel_scope.cancel()  # the run is over: stop the siblings too
        finally:
            parent.usage.add(child.usage)
            env.submit([End(br=child.branch)])

    async with anyio.create_task_group() as group:
        for index in range(len(children)):
            group.start_soon(run_child, index)
    if errors:
        raise next((e for e in errors if isinstance(e, FATAL)), errors[0])
    return [result for result in results if result is not None]


def _check_children(children: object) -> list[list[Message]]:
    if not isinstance(children, list | tuple) or not children:
        raise UserError("fan_out: a non-empty list of (agent, input) pairs expected")
    inputs = []
    for index, pair in enumerate(children):
        if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], Agent)):
            raise UserError(f"fan_out: children[{index}] must be an (Agent, input) pair")
        inputs.append(input_messages(pair[1], f"fan_out: children[{index}] input"))
    return inputs


def _task(instructions: str | None, task: list[Message]) -> list[Message]:
    """A forked child's opening: its instructions ride in the user turn, not the system
    prompt, which belongs to the shared prefix."""
    if not instructions:
        return task
    if len(task) == 1 and task[0]["role"] == "user" and isinstance(task[0].get("content"), str):
        return [{"role": "user", "content": f"{instructions}\n\n{task[0]['content']}"}]
    return [{"role": "user", "content": instructions}, *task]
