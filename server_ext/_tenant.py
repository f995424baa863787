"""Who is asking: the tenant that scopes every session key and budget."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

__all__ = ["DEFAULT_TENANT", "resolve_tenant"]

DEFAULT_TENANT = "default"


def resolve_tenant(headers: Mapping[str, str], trusted_header: str | None) -> str:
    """The tenant of a request, from lower-cased ``headers``.

    A trusted gateway's header wins when configured (the gateway must strip it
    from client traffic); otherwise the API key, hashed so the key itself never
    lands in engine state or logs; otherwise the single default tenant.
    """
    if trusted_header is not None:
        value = headers.get(trusted_header.lower())
        if value:
            return "gw:" + hashlib.sha256(value.encode()).hexdigest()[:16]
    auth = headers.get("authorization", "")
    scheme, _, key = auth.partition(" ")
    if scheme.lower() == "bearer" and key.strip():
        return "key:" + hashlib.sha256(key.strip().encode()).hexdigest()[:16]
    return DEFAULT_TENANT
