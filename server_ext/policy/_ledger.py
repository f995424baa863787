"""Distinct-block accounting behind the retention budgets."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ._heap import IndexedHeap


class BlockLedger:
    """Which block ids retentions hold, globally and per tenant.

    Every retention holds its own reference on each of its block ids (the
    adapter touches them on ``Hold`` and frees them on ``Release``), so a block
    shared by a parent and its forks carries one reference per retention. The
    budget is about memory, though, so it counts *distinct* block ids: a shared
    prefix costs once.

    Invariants:
      - ``_refs[b]`` is the number of live retentions holding block ``b``; it
        is > 0 (entries are removed when they reach 0).
      - ``_tenant_refs[t][b]`` is the same over tenant ``t``'s retentions; a
        tenant with no held block has no entry.
      - ``held == len(_refs)`` and ``tenant_held(t) == len(_tenant_refs[t])``.
      - ``_by_held`` ranks exactly the tenants of ``_tenant_refs`` by
        ``-tenant_held(t)``: the fair-share checks read the largest holder
        and the tenant count in O(1), whatever the number of tenants.
    """

    def __init__(self) -> None:
        self._refs: dict[int, int] = {}
        self._tenant_refs: dict[str, dict[int, int]] = {}
        self._by_held: IndexedHeap[str] = IndexedHeap()

    @property
    def held(self) -> int:
        """Distinct block ids held by any retention."""
        return len(self._refs)

    def tenants(self) -> list[str]:
        """The tenants holding blocks."""
        return list(self._tenant_refs)

    def tenant_held(self, tenant: str) -> int:
        """Distinct block ids held by ``tenant``'s retentions."""
        return len(self._tenant_refs.get(tenant, ()))

    def tenant_count(self, newcomer: str | None = None) -> int:
        """The number of tenants holding blocks, with ``newcomer`` counted."""
        return len(self._tenant_refs) + (newcomer is not None and newcomer not in self._tenant_refs)

    def most_held(self) -> int:
        """The most distinct block ids any one tenant holds (0 if none)."""
        top = self._by_held.peek()
        return 0 if top is None else -top[0]

    def add(self, tenant: str, blocks: Iterable[int]) -> None:
        """Count one more holder of each of ``blocks`` (distinct ids)."""
        tenant_refs = self._tenant_refs.setdefault(tenant, {})
        refs = self._refs
        for b in blocks:
            refs[b] = refs.get(b, 0) + 1
            tenant_refs[b] = tenant_refs.get(b, 0) + 1
        self._rank(tenant, tenant_refs)

    def remove(self, tenant: str, blocks: Iterable[int]) -> tuple[list[int], list[int]]:
        """Count one holder fewer; return the blocks no longer held globally
        and those no longer held by ``tenant``."""
        tenant_refs = self._tenant_refs[tenant]
        freed: list[int] = []
        tenant_freed: list[int] = []
        refs = self._refs
        for b in blocks:  # hundreds of blocks a call: inline
            n = refs[b]
            if n == 1:
                del refs[b]
                freed.append(b)
            else:
                refs[b] = n - 1
            n = tenant_refs[b]
            if n == 1:
                del tenant_refs[b]
                tenant_freed.append(b)
            else:
                tenant_refs[b] = n - 1
        if not tenant_refs:
            del self._tenant_refs[tenant]
        self._rank(tenant, tenant_refs)
        return freed, tenant_freed

    def _rank(self, tenant: str, tenant_refs: dict[int, int]) -> None:
        if tenant_refs:
            self._by_held.set(tenant, -len(tenant_refs))
        else:
            self._by_held.remove(tenant)

    def new_blocks(self, tenant: str, blocks: Iterable[int]) -> tuple[int, int]:
        """How many of ``blocks`` (distinct ids) would newly count against the
        global and the tenant budget."""
        tenant_refs = self._tenant_refs.get(tenant, {})
        blocks = list(blocks)
        refs = self._refs
        new = len(blocks) - sum(map(refs.__contains__, blocks))
        new_tenant = len(blocks) - sum(map(tenant_refs.__contains__, blocks))
        return new, new_tenant

    def fitting_prefix(self, tenant: str, blocks: Sequence[int], cap: int, tenant_cap: int) -> int:
        """Length of the longest prefix of ``blocks`` that fits both caps."""
        tenant_refs = self._tenant_refs.get(tenant, {})
        held, tenant_held = self.held, len(tenant_refs)
        for i, b in enumerate(blocks):
            held += b not in self._refs
            tenant_held += b not in tenant_refs
            if held > cap or tenant_held > tenant_cap:
                return i
        return len(blocks)
