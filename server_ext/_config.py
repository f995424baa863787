"""The extension's settings: one source, ``kv_connector_extra_config``.

The engine-side connector and the API-server middleware both read this mapping
(the middleware through ``app.state.vllm_config``), so an operator configures the
extension in one place and the two processes can never disagree.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .policy import (
    AdmissionConfig,
    AdmissionTrial,
    EstimatorConfig,
    PolicyConfig,
    StepTimer,
    WarmFirstGate,
)

__all__ = [
    "CONNECTOR_MODULE",
    "CONNECTOR_NAME",
    "HOST_OFFLOADING_CONNECTOR",
    "LOOPBACK_PEERS",
    "MULTI_CONNECTOR",
    "OFFLOADING_CONNECTOR",
    "OFFLOADING_CONNECTORS",
    "OFFLOAD_MODULE",
    "OFFLOAD_POLICY",
    "OFFLOAD_SPEC",
    "OFFLOAD_STORE_KEY",
    "RETENTION_MODES",
    "ExtensionConfig",
    "ExtensionConfigError",
    "extension_extra",
    "flag",
]

CONNECTOR_NAME = "AgentHintsConnector"
CONNECTOR_MODULE = "server_ext.connector"

MULTI_CONNECTOR = "MultiConnector"
"""vLLM's connector that composes others (``connectors`` in its extra config)."""
OFFLOADING_CONNECTOR = "OffloadingConnector"
"""vLLM's KV offloading connector: the extension's host tier."""
HOST_OFFLOADING_CONNECTOR = "HostOffloadingConnector"
"""vLLM's offloading connector whose loads complete in step where the copy is a
host memcpy (``server_ext.offload``); what the extension's launches use."""
OFFLOADING_CONNECTORS = (OFFLOADING_CONNECTOR, HOST_OFFLOADING_CONNECTOR)
OFFLOAD_MODULE = "server_ext.offload"
"""vLLM's ``kv_connector_module_path``, ``spec_module_path`` and
``cache_policy_module_path`` for the connector above and the two below."""
OFFLOAD_SPEC = "HostOffloadingSpec"
"""vLLM's CPU offloading spec, with a host-to-host copy where vLLM has none."""
OFFLOAD_POLICY = "AgentHintsCachePolicy"
"""The offloading tier's cache policy that reads the hints."""
OFFLOAD_STORE_KEY = "store"
"""The key of ``HostOffloadingConnector``'s extra config that says when it
stores a block (``server_ext.tier.TIER_STORES``)."""


def extension_extra(
    kv_connector: str | None, extra: Mapping[str, object] | None
) -> Mapping[str, object] | None:
    """The extension's ``kv_connector_extra_config`` in a ``--kv-transfer-config``
    of ``kv_connector`` and ``extra``: its own when it is the connector, its
    entry's when ``MultiConnector`` lists it; None when it is not configured."""
    if kv_connector == CONNECTOR_NAME:
        return extra or {}
    if kv_connector != MULTI_CONNECTOR:
        return None
    children = (extra or {}).get("connectors")
    for child in children if isinstance(children, list) else ():
        if isinstance(child, Mapping) and child.get("kv_connector") == CONNECTOR_NAME:
            found = child.get("kv_connector_extra_config")
            return found if isinstance(found, Mapping) else {}
    return None


# The policy's defaults: the extension's own defaults are these, not copies.
_ADMISSION = AdmissionConfig()
_ESTIMATOR = EstimatorConfig()
_POLICY = PolicyConfig(total_blocks=0)


LOOPBACK_PEERS = "127.0.0.0/8,::1"
"""Where a gateway that sets ``tenant_header`` is trusted from by default."""

RETENTION_MODES = ("order", "hold")
"""How retention keeps a branch's blocks: ``order`` leaves them free and only
decides which free block goes next (they cannot take room from any request),
``hold`` takes a block reference and gives it back under pressure."""


def setting(default: Any, help: str) -> Any:
    """One setting of ``ExtensionConfig``: its default and the one line that
    ``python -m server_ext serve --help`` shows for its flag (``flag``)."""
    return dataclasses.field(default=default, metadata={"help": help})


def flag(name: str) -> str:
    """The command-line flag of setting ``name``: dashes, and no unit suffix
    (``ttl_cap_s``: ``--ttl-cap``)."""
    return "--" + name.removesuffix("_s").replace("_", "-")


class ExtensionConfigError(ValueError):
    """An invalid ``kv_connector_extra_config`` entry; the message names the key."""


@dataclass(frozen=True, slots=True)
class ExtensionConfig:
    """Operator knobs of the extension: each is declared once, here (its
    ``setting``), and becomes a ``kv_connector_extra_config`` key of its name
    and a flag of ``python -m server_ext serve`` (``flag``).

    Args:
        retention: ``RETENTION_MODES``: by eviction order (the default) or by
            held references.
        order_trial: Retention by eviction order keeps the books of what its
            order gains and costs against plain LRU, and applies it only
            while it pays (plain LRU until then). False: it always applies
            (clients known to gain from it).
        max_held_fraction: Cap on blocks held for idle sessions, fraction of the pool.
        max_tenant_fraction: Cap per tenant, fraction of the global cap.
        ttl_cap_s: No retention outlives this, whatever a client asks.
        default_ttl_s: Longest retention when a client gives neither gap nor ttl.
        tenant_header: Header set by a trusted gateway that names the tenant; when
            unset, the tenant is derived from the API key. Trusted only from
            ``tenant_header_peers`` and, with ``gateway_secret_header``, only
            with the shared secret; a request that carries it from anywhere
            else is refused (403).
        tenant_header_peers: Comma-separated addresses or CIDR networks of the
            gateways whose ``tenant_header`` is trusted (default: loopback).
        gateway_secret_header: Header in which the gateway also presents the
            shared secret of the environment variable
            ``AGENT_HINTS_GATEWAY_SECRET`` (a secret never sits in this config,
            which vLLM logs); it is stripped before vLLM sees the request.
        salt_per_tenant: Every request's ``cache_salt`` starts with its tenant,
            so tenants never share prefix-cache entries (SPEC 8.2: closes the
            cross-tenant timing side channel).
        control_rate: Control-endpoint requests per second per tenant (bursts
            of twice as many); more are answered 429 (0: unlimited).
        state_metrics: Export the per-reason retention counters that move with
            whether a client-named session exists (``ends``, ``returns``,
            ``replacements``, ``clipped``, ``rejected``): an oracle for anyone
            who can read ``/metrics`` and guess a session id of its tenant.
        prefetch: Re-prefill an idle branch's last prompt (a 1-token warm-up) while
            no real request prefills, just before the branch is expected back.
        prefetch_min_accuracy: Warm-ups may evict retentions of branches due
            back later only while at least this share of recent warmed
            retentions lasted until their branch came back; below it they
            use free blocks only (0: always).
        max_defer_s: Warm-first admission: a hinted request with a long uncached
            prefill may wait up to this long while cheaper hinted requests go
            first. 0 (the default): off, first come, first served; on the
            workload suite it cost more queueing than it saved (opt in, e.g.
            10, where a run of the suite says it pays).
        defer_lookahead_s: Warm-first admission: a hinted cold prefill waits
            while a retained branch is expected back (before or after now)
            within the time the prefill would take, as measured on the
            engine's steps, and at most this many seconds; for at most
            ``max_defer_s``.
        admission_trial: Warm-first admission tries itself out online
            (``AdmissionTrial``): epochs of arrivals gated or first come,
            first served, and it keeps to the side whose first tokens come
            sooner. False: it always applies (clients known to gain from it).
        gap_hint_weight: How many observed gaps a client's ``gap`` (or a
            tool's ``eta``) counts for against the gaps the server learned;
            raise it for clients whose hints are known to be accurate.
        headroom: A waiting request is admitted only if the running requests
            keep room to finish their prompts and write their next block
            (``server_ext._headroom``): no preemption follows an admission
            that filled the pool. False: vLLM's own admission.
    """

    retention: str = setting(
        "order",
        "by eviction order (default: blocks stay in vLLM's free queue) or by held references",
    )
    order_trial: bool = setting(
        True,
        "retention by eviction order applies only while its books show it pays, plain "
        "LRU otherwise (default: on; --no-order-trial: it always applies)",
    )
    max_held_fraction: float = setting(0.5, "cap on retained blocks (of pool)")
    max_tenant_fraction: float = setting(0.5, "per-tenant cap (of the cap)")
    ttl_cap_s: float = setting(600.0, "longest retention (s)")
    default_ttl_s: float = setting(60.0, "longest retention without a gap or ttl hint (s)")
    tenant_header: str | None = setting(None, "tenant header set by a trusted gateway")
    tenant_header_peers: str | None = setting(
        None,
        "comma-separated addresses or CIDR networks trusted to set --tenant-header "
        "(default: loopback)",
    )
    gateway_secret_header: str | None = setting(
        None, "header in which the gateway presents the secret of $AGENT_HINTS_GATEWAY_SECRET"
    )
    salt_per_tenant: bool = setting(
        True, "prefix the tenant to every request's cache_salt (default: on)"
    )
    control_rate: float = setting(
        100.0, "control-endpoint requests per second per tenant (0: unlimited)"
    )
    state_metrics: bool = setting(
        False, "export the retention counters that reveal whether a session exists"
    )
    prefetch: bool = setting(False, "warm idle branches before return")
    prefetch_min_accuracy: float = setting(
        _POLICY.prefetch_min_accuracy,
        "share of recent warm-ups that must pay off for warm-ups to evict (0: always)",
    )
    max_defer_s: float = setting(
        0.0, "warm-first admission: longest a cold prefill waits for cheaper ones (s; 0: off)"
    )
    defer_lookahead_s: float = setting(
        _ADMISSION.lookahead_s,
        "warm-first admission: a cold prefill waits for a branch due back before it "
        "would be done, and within this (s, 0: never)",
    )
    admission_trial: bool = setting(
        True,
        "warm-first admission tries itself out online and steps back where it does "
        "not pay (default: on; --no-admission-trial: it always applies)",
    )
    gap_hint_weight: float = setting(
        _ESTIMATOR.hint_weight, "observed gaps a client's gap hint counts for against learned ones"
    )
    headroom: bool = setting(
        True,
        "admit a waiting request only where the running ones keep room to finish their "
        "prompts and write their next block (default: on; --no-headroom: vLLM's admission)",
    )

    @classmethod
    def from_mapping(cls, extra: Mapping[str, object] | None) -> ExtensionConfig:
        """Read the known keys of ``extra`` (others belong to other connectors)."""
        values: dict[str, object] = {}
        for f in dataclasses.fields(cls):
            if extra is None or f.name not in extra:
                continue
            value = extra[f.name]
            default = f.default
            if f.name == "retention":
                ok = value in RETENTION_MODES
            elif isinstance(default, bool):
                ok = isinstance(value, bool)
            elif isinstance(default, float):
                ok = isinstance(value, int | float) and not isinstance(value, bool) and value >= 0
            else:
                ok = value is None or (isinstance(value, str) and value != "")
            if not ok:
                raise ExtensionConfigError(
                    f"kv_connector_extra_config[{f.name!r}]={value!r}: expected "
                    f"{_expected(f.name, default)}"
                )
            values[f.name] = float(value) if isinstance(default, float) else value  # type: ignore[arg-type]
        try:
            config = cls(**values)  # type: ignore[arg-type]
        except ValueError as e:  # pragma: no cover - dataclass has no checks of its own
            raise ExtensionConfigError(str(e)) from e
        config.trusted_peers()  # an unparsable list fails at start-up, not per request
        return config

    @property
    def order_enforce(self) -> bool | None:
        """``ShelfPort``'s ``enforce``: None lets its books decide."""
        return None if self.order_trial else True

    def trusted_peers(self) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
        """The networks whose ``tenant_header`` is trusted (``tenant_header_peers``)."""
        text = self.tenant_header_peers or LOOPBACK_PEERS
        try:
            return tuple(
                ipaddress.ip_network(part.strip(), strict=False) for part in text.split(",")
            )
        except ValueError as e:
            raise ExtensionConfigError(
                f"kv_connector_extra_config['tenant_header_peers']={text!r}: expected "
                f"comma-separated addresses or CIDR networks ({e})"
            ) from e

    def check(self) -> None:
        """Build what the engine builds from these settings, so that a launch
        refuses a bad value before vLLM starts (the error names the key)
        rather than when the engine core binds its KV cache manager."""
        self.policy_config(0)
        self.admission_gate(block_size=1)

    def policy_config(self, total_blocks: int) -> PolicyConfig:
        """The retention policy's budgets for a pool of ``total_blocks``."""
        estimator = self.estimator_config()
        settings: dict[str, Any] = {
            "max_held_fraction": self.max_held_fraction,
            "max_tenant_fraction": self.max_tenant_fraction,
            "ttl_cap_s": self.ttl_cap_s,
            "default_ttl_s": self.default_ttl_s,
            "prefetch_min_accuracy": self.prefetch_min_accuracy,
        }
        try:
            return dataclasses.replace(
                _POLICY, total_blocks=total_blocks, estimator=estimator, **settings
            )
        except ValueError as e:
            # PolicyConfig states the rule, not the key: the key is the one
            # that breaks the rule on its own (its other settings at their defaults).
            for key, value in settings.items():
                try:
                    dataclasses.replace(_POLICY, **{key: value})
                except ValueError:
                    raise ExtensionConfigError(
                        f"kv_connector_extra_config[{key!r}]={value!r}: {e}"
                    ) from e
            raise ExtensionConfigError(f"kv_connector_extra_config: {e}") from e

    def estimator_config(self) -> EstimatorConfig:
        """The gap estimator's settings (shared by retention and prefetch)."""
        if self.gap_hint_weight <= 0:
            raise ExtensionConfigError(
                f"kv_connector_extra_config['gap_hint_weight']={self.gap_hint_weight}: "
                "expected a positive number"
            )
        return dataclasses.replace(_ESTIMATOR, hint_weight=self.gap_hint_weight)

    def admission_gate(
        self,
        block_size: int,
        tiered: bool = False,
        step_tokens: int | None = None,
        timer: StepTimer | None = None,
    ) -> WarmFirstGate | None:
        """The warm-first gate for an engine of ``block_size``-token blocks
        whose steps ``timer`` times, or None when ``max_defer_s`` is 0.

        With a KV tier (``tiered``) a released branch comes back by a load,
        not a recompute, so no request waits for a due branch: only the
        shortest-prefill-first rule remains.
        """
        if self.max_defer_s == 0:
            return None
        lookahead = 0.0 if tiered else self.defer_lookahead_s
        return WarmFirstGate(
            AdmissionConfig(
                max_defer_s=self.max_defer_s,
                lookahead_s=lookahead,
                block_size=block_size,
                step_tokens=step_tokens,
            ),
            AdmissionTrial(fixed_share=None if self.admission_trial else 1.0),
            timer,
        )


def _expected(name: str, default: object) -> str:
    if name == "retention":
        return " or ".join(repr(m) for m in RETENTION_MODES)
    return type(default).__name__ if default is not None else "a header name"
