"""``python -m server_ext``: serve vLLM with the extension, or make the test model."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import os
import shlex
import sys
from collections.abc import Sequence
from typing import Any

from ._config import RETENTION_MODES, ExtensionConfig, ExtensionConfigError, flag
from ._launcher import VllmArgsError, byte_size, extension_env, vllm_command
from .tier import DEFAULT_TIER, TIER_KINDS, TIER_STORES, TierConfigError

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
    for setting in dataclasses.fields(ExtensionConfig):
        _add_setting(serve, setting)
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
    serve.add_argument(
        "--tier-store",
        choices=TIER_STORES,
        help=f"when the host tier stores a block (default: {TIER_STORES[0]}: as computed, "
        "vLLM's write-through; evicted: when the device evicts it, so that device and tier "
        "hold different blocks)",
    )
    serve.add_argument("--print-command", action="store_true", help="print the argv and exit")
    make = commands.add_parser("make-test-model", help="write the tiny test checkpoint")
    make.add_argument("directory")
    return parser, serve


def _add_setting(serve: argparse.ArgumentParser, setting: dataclasses.Field[Any]) -> None:
    """The flag of one ``ExtensionConfig`` setting (None: unset, so the
    setting keeps its default or the value a ``--kv-transfer-config`` gives)."""
    help = setting.metadata["help"]
    name, default = flag(setting.name), setting.default
    if setting.name == "retention":
        serve.add_argument(name, dest=setting.name, choices=RETENTION_MODES, help=help)
    elif default is True:
        action = argparse.BooleanOptionalAction
        serve.add_argument(name, dest=setting.name, action=action, default=None, help=help)
    elif default is False:
        serve.add_argument(name, dest=setting.name, action="store_true", default=None, help=help)
    elif isinstance(default, float):
        serve.add_argument(name, dest=setting.name, type=float, help=help)
    else:
        serve.add_argument(name, dest=setting.name, help=help)


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
