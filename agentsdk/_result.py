"""The outcome of a run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._items import Message, RunItem
from ._usage import Usage

__all__ = ["RunResult"]


@dataclass(frozen=True)
class RunResult:
    """What a finished run produced.

    ``usage`` includes the run's sub-agents. ``input`` and ``new_messages`` exclude the
    system prompt and the session's earlier history. ``final_output`` is the answer's
    text, or the validated value of the agent's ``output_type``.
    """

    agent_name: str
    session_id: str
    branch: str
    input: list[Message]
    new_messages: list[Message]
    new_items: list[RunItem]
    final_output: Any
    usage: Usage

    def to_input_list(self) -> list[Message]:
        """The conversation so far, ready to pass as the next run's input."""
        return [*self.input, *self.new_messages]
