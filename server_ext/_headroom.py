"""Admission headroom: a waiting request is admitted only where the running
ones can still grow.

vLLM admits a waiting request when its blocks fit the free pool now. What the
running requests take next (a chunked prefill's next chunk, the next decode
block) is not counted, so an admission that fills the pool makes one of them
preempt another a few steps later, and the victim's computed work is lost.
Prefixes served from the cache or a tier make admissions bigger (a whole
prompt's blocks in one step instead of a chunk) and prefills shorter, so more
requests decode at once in a fuller pool than plain vLLM's. At each admission
the extension therefore keeps free what every running request takes in its
next step of prefill (at most a step's tokens) and its next ``block_size``
tokens after that, none past its ``max_tokens``. It is checked again at every
step, so a long prefill is never reserved whole (short requests may still go
beside it, as in vLLM); with nothing running nothing is kept, so a request
that needs the whole pool is still admitted once it is alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

__all__ = ["Headroom", "RunningRequest", "blocks_to_grow"]


class RunningRequest(Protocol):
    """What the headroom reads of a vLLM ``Request``."""

    @property
    def request_id(self) -> str: ...
    @property
    def num_prompt_tokens(self) -> int: ...
    @property
    def num_tokens(self) -> int: ...
    @property
    def max_tokens(self) -> int | None: ...


def blocks_to_grow(
    request: RunningRequest, allocated: int, block_size: int, step_tokens: int
) -> int:
    """Blocks ``request`` (holding ``allocated``) takes in its next step of at
    most ``step_tokens`` prefill tokens and the ``block_size`` tokens after
    it, never past its prompt plus ``max_tokens``."""
    reach = min(request.num_tokens, allocated * block_size + step_tokens) + block_size
    if request.max_tokens is not None:
        reach = min(reach, request.num_prompt_tokens + request.max_tokens)
    return max(-(-reach // block_size) - allocated, 0)


class Headroom:
    """The blocks an admission must leave free, within one scheduler step.

    Summed over the running requests at the step's first admission (vLLM has
    allocated their blocks for the step by then), then grown by each request
    admitted in the step; ``new_step`` starts over. ``allocated`` gives the
    blocks a request holds (one KV cache group); ``step_tokens`` is the most
    tokens a step schedules.
    """

    def __init__(self, block_size: int, step_tokens: int, allocated: Callable[[str], int]) -> None:
        self._block_size = block_size
        self._step_tokens = step_tokens
        self._allocated = allocated
        self._reserve: int | None = None

    def reserve(self, running: Iterable[RunningRequest]) -> int:
        """Blocks to keep free at an admission while ``running`` run."""
        if self._reserve is None:
            self._reserve = sum(self._grow(r) for r in running)
        return self._reserve

    def admitted(self, request: RunningRequest) -> None:
        """``request`` was admitted this step: later admissions leave it room too."""
        if self._reserve is not None:
            self._reserve += self._grow(request)

    def new_step(self) -> None:
        self._reserve = None

    def _grow(self, request: RunningRequest) -> int:
        held = self._allocated(request.request_id)
        return blocks_to_grow(request, held, self._block_size, self._step_tokens)
