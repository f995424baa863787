"""Token accounting for a run and, through the session store, for a whole session."""

from __future__ import annotations

from openai.types import CompletionUsage
from pydantic import BaseModel

__all__ = ["Usage"]


class Usage(BaseModel):
    """Counts summed over model calls.

    ``cached_tokens`` is the part of ``input_tokens`` the server served from its prefix
    cache (``usage.prompt_tokens_details.cached_tokens``): the number this project exists
    to raise.
    """

    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def add(self, other: Usage) -> None:
        """Accumulate ``other`` in place (a run adds each call, a parent adds its children)."""
        self.requests += other.requests
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.cached_tokens += other.cached_tokens

    @classmethod
    def from_completion(cls, usage: CompletionUsage | None) -> Usage:
        """One request's usage; servers that report nothing still count as a request."""
        if usage is None:
            return cls(requests=1)
        details = usage.prompt_tokens_details
        return cls(
            requests=1,
            input_tokens=usage.prompt_tokens,
            output_tokens=usage.completion_tokens,
            cached_tokens=(details.cached_tokens or 0) if details is not None else 0,
        )
