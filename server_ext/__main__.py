"""``python -m server_ext``: serve vLLM with the extension, or make the test model."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence

from ._config import RETENTION_MODES
from .tier import DEFAULT_TIER, TIER_KINDS


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m server_ext")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve", help="start vLLM's OpenAI server with the extension; unknown args go to vLLM"
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
        "--tier-bytes", type=int, help="host tier budget per worker, bytes (default: 1 GiB)"
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
    args, rest = parser.parse_known_args(argv)

    if args.command == "make-test-model":
        from ._testmodel import make_test_model

        print(make_test_model(args.directory))
        return 0
    if rest and not all(a.startswith("-") or i > 0 for i, a in enumerate(rest)):
        parser.error(f"unexpected arguments before vLLM flags: {rest}")

    from ._launcher import extension_env, vllm_command

    knobs = (
        "max_held_fraction",
        "max_tenant_fraction",
        "ttl_cap_s",
        "default_ttl_s",
        "prefetch_min_accuracy",
        "max_defer_s",
        "defer_lookahead_s",
        "gap_hint_weight",
        "control_rate",
        "tier_bytes",
    )
    extra: dict[str, object] = {k: getattr(args, k) for k in knobs if getattr(args, k) is not None}
    for name in (
        "retention",
        "tier",
        "tenant_header",
        "tenant_header_peers",
        "gateway_secret_header",
    ):
        if getattr(args, name):
            extra[name] = getattr(args, name)
    for flag in (
        "salt_per_tenant",
        "prefetch",
        "state_metrics",
        "admission_trial",
        "order_trial",
        "headroom",
    ):
        if getattr(args, flag) is not None:
            extra[flag] = getattr(args, flag)
    command = vllm_command(args.model, rest, extra_config=extra)
    env = extension_env(rest)
    if args.print_command:
        print(shlex.join([*(f"{k}={v}" for k, v in env.items()), *command]))
        return 0
    os.execve(command[0], command, {**os.environ, **env})
    return 1  # pragma: no cover - execv does not return


if __name__ == "__main__":
    sys.exit(main())
