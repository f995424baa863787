"""Hints from HTTP into the request body that reaches vLLM (the middleware's
rewrite of every JSON POST).

- on inference routes it parses ``Agent-Hints`` (header lines combined as RFC
  9110 says), ``agent_hints`` (body) and interop fields with the ``hints_spec``
  codec, and rewrites the JSON body so that vLLM's ``session_id`` is set and
  the normalized hints ride to the engine inside ``kv_transfer_params``
  (``_contract.hint_params``). A malformed hint is counted and dropped; the
  request is served exactly as if it had none.
- it strips the extension's reserved ``kv_transfer_params`` keys, so a client
  can never forge a tenant or a control message.
- with ``salt_per_tenant``, the request's ``cache_salt`` starts with its tenant
  (a client's own salt is kept after it).

Bodies without any hint-related bytes pass through untouched (no JSON round trip);
when such a body's request is hinted by headers, its new fields are spliced in
front of its members, still without decoding it. Such bytes are looked for in the
raw body, so a body that could spell them otherwise (a JSON ``\\u`` escape, or
not UTF-8) is parsed too.
"""

from __future__ import annotations

import json
from typing import Any

from prometheus_client import Counter

from hints_spec import (
    BODY_FIELD,
    HEADER_NAME,
    ROOT_BRANCH,
    SESSION_HEADER,
    combine_field_lines,
    resolve_hints,
)

from ._asgi import Scope, route, splice_members
from ._config import ExtensionConfig
from ._contract import RESERVED_KEYS, hint_params
from ._prefetch import Branch
from .policy import BranchKey

__all__ = ["CHAT_PATH", "INFERENCE_PATHS", "VLLM_RETENTION_VALUES", "Refused", "rewrite"]

CHAT_PATH = "/v1/chat/completions"
INFERENCE_PATHS = frozenset({CHAT_PATH, "/v1/completions", "/v1/responses"})
_HEADER = HEADER_NAME.lower()
_INTEROP_HEADERS = (SESSION_HEADER.lower(), "x-dynamo-session-id")
# Any of these keys in a body means it may carry hints or reserved keys (each has
# a "_", which a token-id prompt never does); so does a JSON escape
# (``agent\u005fhints``) or a NUL byte (a UTF-16 or UTF-32 body, which vLLM
# decodes like UTF-8): they can spell a key without its bytes.
_KEYS = (
    BODY_FIELD.encode(),
    b"prompt_cache_key",
    b"prompt_cache_retention",
    b"session_id",
    b"cache_control",
)

PARSE_ERRORS = Counter(
    "agent_hints_parse_errors",
    "Malformed hints ignored; the request was served without them",
    labelnames=["source", "code"],
)
HINTED_REQUESTS = Counter("agent_hints_requests", "Inference requests that carried hints")

VLLM_RETENTION_VALUES = ("in_memory", "24h")
"""The ``prompt_cache_retention`` values vLLM 0.33 accepts (others: 400)."""


def _engine_retention(payload: dict[str, Any]) -> bool:
    """Leave vLLM a ``prompt_cache_retention`` it accepts (SPEC 5.1): the
    hint's lowering took any other duration as ``ttl`` (or, malformed,
    ignored it), and ``in-memory`` is OpenAI's spelling of ``in_memory``.
    Whether the body changed."""
    value = payload.get("prompt_cache_retention")
    if value is None or value in VLLM_RETENTION_VALUES:
        return False
    if value == "in-memory":
        payload["prompt_cache_retention"] = "in_memory"
    else:
        del payload["prompt_cache_retention"]
    return True


class Refused(Exception):
    """Answer the request with this error instead of forwarding it."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code


def rewrite(
    config: ExtensionConfig | None, tenant: str | None, scope: Scope, body: bytes
) -> tuple[bytes, Branch | None]:
    """The body to forward (``body`` itself unless hints or reserved keys
    changed it) and the branch of its lowered hints; ``Refused`` when the
    request is to be answered with an error instead."""
    inference = route(scope) in INFERENCE_PATHS
    salted = config is not None and config.salt_per_tenant and tenant is not None
    headers = combine_field_lines(
        (k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]
    )
    has_header = _HEADER in headers or any(h in headers for h in _INTEROP_HEADERS)
    marked = _may_carry_hints(body)
    if not (salted or has_header or marked):
        return body, None
    # A body with nothing to read or edit (hints only in headers, the SDK's
    # way) is not decoded: the new top-level fields are spliced in front of
    # its members. Re-encoding a 100k-token prompt took 4-27 ms here, on
    # the event loop every other request's stream shares.
    splice = (
        not marked
        and not _mentions(body, b"kv_transfer_params")
        and not (salted and _mentions(body, b"cache_salt"))
        and body.lstrip()[:1] == b"{"
    )
    try:
        payload = {} if splice else json.loads(body)
    except ValueError:
        return body, None  # vLLM answers malformed JSON itself
    except RecursionError:
        # vLLM's own decoder might get further, with keys this one never saw.
        raise Refused(400, "too_deep", "JSON body nested too deeply") from None
    if not isinstance(payload, dict):
        return body, None
    hints = None
    if inference and config is not None:
        hints, errors = resolve_hints(headers, payload)
        for source, error in errors:
            PARSE_ERRORS.labels(source, error.code).inc()
    changed = payload.pop(BODY_FIELD, None) is not None
    if inference and config is not None:
        changed |= _engine_retention(payload)
    transfer = payload.get("kv_transfer_params")
    if isinstance(transfer, dict):
        for key in RESERVED_KEYS:
            changed |= transfer.pop(key, None) is not None
    branch = None
    if salted:
        assert tenant is not None
        client_salt = payload.get("cache_salt")
        if client_salt is None or isinstance(client_salt, str):  # else vLLM rejects it
            payload["cache_salt"] = f"{tenant}/{client_salt}" if client_salt else tenant
            changed = True
    if hints is not None and hints.sid is not None and tenant is not None:
        branch = Branch(BranchKey(tenant, hints.sid, hints.br or ROOT_BRANCH), hints.gap, hints.end)
        payload.setdefault("session_id", hints.sid)
        if not isinstance(transfer, dict):
            transfer = payload["kv_transfer_params"] = {}
        transfer.update(hint_params(tenant, hints))
        HINTED_REQUESTS.inc()
        changed = True
    if not changed:
        return body, branch
    try:
        return (splice_members(body, payload) if splice else json.dumps(payload).encode()), branch
    except RecursionError:
        raise Refused(400, "too_deep", "JSON body nested too deeply") from None


def _may_carry_hints(body: bytes) -> bool:
    """Whether ``body`` has bytes that could spell a hint or a reserved key.

    Single bytes are looked for first (a fast ``memchr``): scanning a 100k-token
    prompt for each key takes milliseconds, one byte a few microseconds.
    """
    if b"\x00" in body or (b"\\" in body and b"\\u" in body):
        return True
    return b"_" in body and any(key in body for key in _KEYS)


def _mentions(body: bytes, key: bytes) -> bool:
    """Whether ``body`` has the bytes of ``key``, a name with a "_" in it."""
    return b"_" in body and key in body
