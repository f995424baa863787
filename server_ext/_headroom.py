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

Keeping blocks free holds admissions back, and a held-back request's cached
prefix waits in the free queue, where the running requests' allocations may
evict it: where vLLM would not have preempted, the headroom only costs. So it
applies where the extension made the admission, or where the evidence says
vLLM's own admissions overfill the pool:

- an admission that loads blocks from a tier: plain vLLM would prefill those
  tokens chunk by chunk, while the load admits them whole in one step, so
  this is the extension's own doing, and it keeps the room;
- every admission while armed: vLLM short of a block for a running request
  (it preempts one) arms it for the next ``ARMED_ADMISSIONS`` admissions; a
  shortfall again soon after a window ended (within one more window) doubles
  the next window, up to ``MAX_ARMED_ADMISSIONS``, as the workload keeps
  needing it; a later one starts over. Where the pool never runs short,
  admission is vLLM's own; where it does, each re-arming costs one
  preemption, the price of finding out whether the headroom still pays.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

__all__ = [
    "ARMED_ADMISSIONS",
    "MAX_ARMED_ADMISSIONS",
    "Headroom",
    "RunningRequest",
    "blocks_to_grow",
]

ARMED_ADMISSIONS = 256
"""Admissions the headroom stays armed for after vLLM was short of a block for
a running request."""

MAX_ARMED_ADMISSIONS = 4096
"""The longest window that shortfalls soon after each other grow it to."""


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
    request: RunningRequest,
    allocated: int,
    block_size: int,
    step_tokens: int,
    lookahead: int = 0,
) -> int:
    """Blocks ``request`` (holding ``allocated``) takes in its next step of at
    most ``step_tokens`` prefill tokens and the ``block_size`` tokens after
    it, never past its prompt plus ``max_tokens``; plus, as vLLM allocates
    them, its draft tokens, the output placeholders of steps in flight (async
    scheduling) and the engine's ``lookahead`` slots (speculative decoding)."""
    ahead = getattr(request, "num_tokens_with_spec", request.num_tokens) + getattr(
        request, "num_output_placeholders", 0
    )
    reach = min(ahead, allocated * block_size + step_tokens) + block_size
    if request.max_tokens is not None:
        reach = min(reach, request.num_prompt_tokens + request.max_tokens)
    reach += lookahead
    return max(-(-reach // block_size) - allocated, 0)


class Headroom:
    """The blocks an admission must leave free, within one scheduler step.

    Summed over the running requests at the step's first admission (vLLM has
    allocated their blocks for the step by then), then grown by each request
    admitted in the step; ``new_step`` starts over. ``allocated`` gives the
    blocks a request holds (one KV cache group); ``step_tokens`` is the most
    tokens a step schedules, ``lookahead`` the slots vLLM allocates beyond
    them for speculative decoding. Unarmed (``short``), it keeps room only for
    admissions that load from a tier.

    Invariants: ``armed_for`` (admissions left in the window) is between 0 and
    ``window``; ``ARMED_ADMISSIONS <= window <= MAX_ARMED_ADMISSIONS``;
    ``_since`` counts the admissions since the last window ended (None: none
    ended yet, or one is open); ``_short_in_step``: a shortfall was counted
    since ``new_step``.
    """

    def __init__(
        self,
        block_size: int,
        step_tokens: int,
        allocated: Callable[[str], int],
        lookahead: int = 0,
    ) -> None:
        self._block_size = block_size
        self._step_tokens = step_tokens
        self._lookahead = lookahead
        self._allocated = allocated
        self._reserve: int | None = None
        self.armed_for = 0
        self.window = ARMED_ADMISSIONS
        self._since: int | None = None
        self._short_in_step = False

    @property
    def armed(self) -> bool:
        return self.armed_for > 0

    def short(self) -> None:
        """vLLM could not give a running request its blocks (it preempts one):
        arm for a window of admissions, longer if the last one ended recently.
        A step's further shortfalls (vLLM preempts until one fits) are one."""
        if self._short_in_step:
            return
        self._short_in_step = True
        recent = self.armed or (self._since is not None and self._since < self.window)
        self.window = min(2 * self.window, MAX_ARMED_ADMISSIONS) if recent else ARMED_ADMISSIONS
        self.armed_for, self._since = self.window, None

    def reserve(self, running: Iterable[RunningRequest], loads: bool = False) -> int:
        """Blocks to keep free at an admission (one that ``loads`` from a tier,
        or any while armed) while ``running`` run."""
        if not (self.armed or loads):
            return 0
        if self._reserve is None:
            self._reserve = sum(self._grow(r) for r in running)
        return self._reserve

    def admitted(self, request: RunningRequest) -> None:
        """``request`` was admitted this step: later admissions leave it room
        too, and the armed window counts it."""
        if self._reserve is not None:
            self._reserve += self._grow(request)
        if self.armed:
            self.armed_for -= 1
            if not self.armed:
                self._since = 0
        elif self._since is not None:
            self._since += 1

    def new_step(self) -> None:
        self._reserve = None
        self._short_in_step = False

    def _grow(self, request: RunningRequest) -> int:
        held = self._allocated(request.request_id)
        return blocks_to_grow(request, held, self._block_size, self._step_tokens, self._lookahead)
