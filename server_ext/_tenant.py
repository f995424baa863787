"""Who is asking: the tenant that scopes every session key and budget.

A tenant is named by exactly one of: a trusted gateway's header, an API key,
or nobody (the single default tenant). A gateway header is trusted only from
the configured peers and, when configured, with the gateway's shared secret; a
request that carries it otherwise is refused, never quietly re-scoped. The API
key is read as vLLM reads it (the first ``Authorization`` line, the credential
after ``Bearer `` byte for byte), so the tenant is the key vLLM checked.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
from collections.abc import Sequence

from ._config import ExtensionConfig, ExtensionConfigError

__all__ = [
    "DEFAULT_TENANT",
    "GATEWAY_SECRET_ENV",
    "Headers",
    "Tenancy",
    "TenantRefused",
    "api_key",
]

DEFAULT_TENANT = "default"
GATEWAY_SECRET_ENV = "AGENT_HINTS_GATEWAY_SECRET"

Headers = Sequence[tuple[bytes, bytes]]
"""An ASGI scope's raw header lines (names lower-cased), in order."""

_AUTHORIZATION = b"authorization"


class TenantRefused(Exception):
    """A request names its tenant in a way this server does not trust."""


def _lines(headers: Headers, name: bytes) -> list[bytes]:
    return [value for key, value in headers if key == name]


def api_key(headers: Headers) -> str | None:
    """The bearer credential of the first ``Authorization`` line, exactly as
    vLLM's ``AuthenticationMiddleware`` compares it; None without one."""
    lines = _lines(headers, _AUTHORIZATION)
    if not lines:
        return None
    scheme, _, key = lines[0].decode("latin-1").partition(" ")
    return key if scheme.lower() == "bearer" and key else None


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode("utf-8", "surrogateescape")).hexdigest()[:16]


class Tenancy:
    """The tenant of each request, by the extension's tenant settings.

    Args:
        config: ``tenant_header``, ``tenant_header_peers`` and
            ``gateway_secret_header``; the secret itself comes from the
            environment variable ``GATEWAY_SECRET_ENV``.
    """

    def __init__(self, config: ExtensionConfig) -> None:
        self.header = config.tenant_header.lower().encode() if config.tenant_header else None
        self.secret_header = (
            config.gateway_secret_header.lower().encode() if config.gateway_secret_header else None
        )
        self._peers = config.trusted_peers()
        self._secret: bytes | None = None
        if self.secret_header is not None:
            secret = os.environ.get(GATEWAY_SECRET_ENV, "")
            if not secret:
                raise ExtensionConfigError(
                    f"kv_connector_extra_config['gateway_secret_header'] is set: put the "
                    f"gateway's shared secret in the environment variable {GATEWAY_SECRET_ENV}"
                )
            self._secret = secret.encode()

    def resolve(self, headers: Headers, peer: str | None, key_counts: bool) -> str:
        """The tenant of a request from ``peer`` (its address, None if unknown).

        ``key_counts``: whether its API key may name the tenant (vLLM verified
        it, or vLLM checks no keys). Raises ``TenantRefused`` for a gateway
        header from an untrusted source, or given more than once.
        """
        if self.header is not None:
            named = _lines(headers, self.header)
            if named:
                if len(named) > 1:
                    raise TenantRefused(f"{self.header.decode()} given more than once")
                if not self._trusted(headers, peer):
                    raise TenantRefused(
                        f"{self.header.decode()} is accepted only from the configured gateway"
                    )
                value = named[0].decode("latin-1")
                if value:
                    return "gw:" + _digest(value)
        key = api_key(headers) if key_counts else None
        return "key:" + _digest(key) if key else DEFAULT_TENANT

    def _trusted(self, headers: Headers, peer: str | None) -> bool:
        try:
            address = ipaddress.ip_address(peer) if peer is not None else None
        except ValueError:
            address = None
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        if address is None or not any(address in network for network in self._peers):
            return False
        if self._secret is None:
            return True
        assert self.secret_header is not None
        given = _lines(headers, self.secret_header)
        return len(given) == 1 and hmac.compare_digest(given[0], self._secret)
