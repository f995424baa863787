"""``python -m server_ext``: serve vLLM with the extension, or make the test model."""

from __future__ import annotations

import argparse
import difflib
import functools
import os
import shlex
import sys
from collections.abc import Sequence

from ._config import RETENTION_MODES, ExtensionConfigError
from ._launcher import VllmArgsError, byte_size, extension_env, vllm_command
from .tier import DEFAULT_TIER, TIER_KINDS, TierConfigError

_TYPO_CUTOFF = 0.8
"""How alike (difflib's ratio) an unknown flag must be to one of the extension's
to be taken for its misspelling: the closest of vLLM 0.32's ~400 flags to any
of ours scores 0.73 (``--kv-cache-metrics`` against ``--state-metrics``), a
transposition or a dropped letter in ours scores 0.9 or more."""


def misspelled(arg: str) -> str | None:
    """The flag of ``serve`` that ``arg`` (an argument its parser did not
    know, so bound for vLLM) looks like a misspelling of, or None: a typo in
    one of the extension's flags would otherwise go to vLLM, which refuses it
    with no word of the flag meant, or takes it for one of its own."""
    if not arg.startswith("--"):
        return None
    name = arg.split("=", 1)[0].replace("_", "-")
    close = difflib.get_close_matches(name, _serve_flags(), n=1, cutoff=_TYPO_CUTOFF)
    return close[0] if close else None


@functools.cache
def _serve_flags() -> list[str]:
    actions = [action for action in _parsers()[1]._actions if action.dest != "help"]
    return [flag for action in actions for flag in action.option_strings if flag[:2] == "--"]


def _parsers() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The command line's parser, and its ``serve`` command's."""
    parser = argparse.ArgumentParser(prog="python -m server_ext")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve",
        help="start vLLM's OpenAI server with the extension; unknown args go to vLLM",
        # A prefix of one of the extension's flags is vLLM's or a typo, never ours.
        allow_abbrev=False,
    )
    serve.add_argument("model")
    serve.add_argument("--max-held-fraction", type=float, help="cap on retained blocks (of pool)")
    serve.add_argument("--max-tenant-fraction", type=float, help="per-tenant cap (of the cap)")
    serve.add_argument("--ttl-cap", type=float, dest="ttl_cap_s", help="longest retention (s)")
    serve.add_argument("--default-ttl", type=float, dest="default_ttl_s")
    serve.add_argument(
        "--retention",
        choices=RETENTION_MODES,
        help="by eviction order (default: blocks stay in vLLM's free queue) or by held references",
    )
    serve.add_argument(
        "--order-trial",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="retention by eviction order applies only while its books show it pays, plain "
        "LRU otherwise (default: on; --no-order-trial: it always applies)",
    )
    serve.add_argument(
        "--headroom",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="admit a waiting request only where the running ones keep room to finish their "
        "prompts and write their next block (default: on; --no-headroom: vLLM's admission)",
    )
    serve.add_argument(
        "--tier",
        choices=TIER_KINDS,
        help=f"KV tier below device memory (default: {DEFAULT_TIER}; none: device memory only; "
        "mooncake: also --kv-transfer-config keys, see docs/tiers.md)",
    )
    serve.add_argument(
        "--tier-bytes",
        type=byte_size,
        help="host tier budget, all workers together: bytes, or 8GiB, 512MiB, 8G (as vLLM "
        "reads sizes), 1e9 (default: 1GiB)",
    )
    serve.add_argument("--tenant-header", help="tenant header set by a trusted gateway")
    serve.add_argument(
        "--tenant-header-peers",
        help="comma-separated addresses or CIDR networks trusted to set --tenant-header "
        "(default: loopback)",
    )
    serve.add_argument(
        "--gateway-secret-header",
        help="header in which the gateway presents the secret of $AGENT_HINTS_GATEWAY_SECRET",
    )
    serve.add_argument(
        "--salt-per-tenant",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="prefix the tenant to every request's cache_salt (default: on)",
    )
    serve.add_argument(
        "--admission-trial",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="warm-first admission tries itself out online and steps back where it does "
        "not pay (default: on; --no-admission-trial: it always applies)",
    )
    serve.add_argument(
        "--control-rate",
        type=float,
        help="control-endpoint requests per second per tenant (0: unlimited)",
    )
    serve.add_argument(
        "--state-metrics",
        action="store_true",
        default=None,
        help="export the retention counters that reveal whether a session exists",
    )
    serve.add_argument(
        "--prefetch", action="store_true", default=None, help="warm idle branches before return"
    )
    serve.add_argument(
        "--prefetch-min-accuracy",
        type=float,
        help="share of recent warm-ups that must pay off for warm-ups to evict (0: always)",
    )
    serve.add_argument(
        "--max-defer",
        type=float,
        dest="max_defer_s",
        help="warm-first admission: longest a cold prefill waits for cheaper ones "
        "(s; default 0: off)",
    )
    serve.add_argument(
        "--defer-lookahead",
        type=float,
        dest="defer_lookahead_s",
        help="warm-first admission: a cold prefill waits for a branch due back before it "
        "would be done, and within this (s, 0: never)",
    )
    serve.add_argument(
        "--gap-hint-weight",
        type=float,
        dest="gap_hint_weight",
        help="observed gaps a client's gap hint counts for against learned ones",
    )
    serve.add_argument("--print-command", action="store_true", help="print the argv and exit")
    make = commands.add_parser("make-test-model", help="write the tiny test checkpoint")
    make.add_argument("directory")
    return parser, serve


def main(argv: Sequence[str] | None = None) -> int:
    parser, serve = _parsers()
    args, rest = parser.parse_known_args(argv)

    if args.command == "make-test-model":
        from ._testmodel import make_test_model

        print(make_test_model(args.directory))
        return 0
    if rest and not all(a.startswith("-") or i > 0 for i, a in enumerate(rest)):
        parser.error(f"unexpected arguments before vLLM flags: {rest}")
    for arg in rest:
        if (flag := misspelled(arg)) is not None:
            serve.error(f"unrecognized argument {arg.split('=', 1)[0]}: did you mean {flag}?")

    # Every option of ``serve`` but these is an extension setting of the same name.
    launch = {"help", "print_command"}
    extra: dict[str, object] = {
        action.dest: value
        for action in serve._actions
        if action.option_strings
        and action.dest not in launch
        and (value := getattr(args, action.dest)) is not None
    }
    try:
        command = vllm_command(args.model, rest, extra_config=extra)
    except (ExtensionConfigError, TierConfigError, VllmArgsError) as e:
        serve.error(str(e))
    env = extension_env(rest)
    if args.print_command:
        print(shlex.join([*(f"{k}={v}" for k, v in env.items()), *command]))
        return 0
    os.execve(command[0], command, {**os.environ, **env})
    return 1  # pragma: no cover - execv does not return


if __name__ == "__main__":
    sys.exit(main())
