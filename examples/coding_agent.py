"""A coding-agent-like loop: explore a small project, run its tests, answer; over two turns.

Runs against any OpenAI-compatible server; the defaults match the project's local vLLM
test bed (random weights), so the turns follow a ``tool_choice`` schedule, the forced
tools take no arguments (``strict``: the server constrains them to ``{}``) and the others
accept whatever arguments a random model writes (``lenient``). The session lives in SQLite: the
second turn resumes it, and the usage lines show the server's prefix cache at work.

    python examples/coding_agent.py --base-url http://127.0.0.1:8000/v1 --model tiny
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import anyio

from agentsdk import (
    Agent,
    HintedAsyncOpenAI,
    ModelSettings,
    RunContext,
    RunHooks,
    Runner,
    SQLiteSession,
    Tool,
    tool,
)

MAX_OUTPUT = 600  # characters of tool output sent back: keeps prompts within a tiny model's window

PROJECT = {
    "README.md": "# calc\nA tiny calculator. TODO: support subtraction.\n",
    "calc.py": "def add(a, b):\n    return a - b  # TODO: wrong operator\n",
    "test_calc.py": (
        "import unittest\nfrom calc import add\n\n\n"
        "class AddTest(unittest.TestCase):\n"
        "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n"
    ),
}


def make_tools(root: Path) -> list[Tool]:
    """Tools bound to the workspace ``root``; each one tolerates any arguments."""

    def inside(path: str) -> Path:
        resolved = (root / path).resolve()
        return resolved if resolved.is_relative_to(root) else root

    @tool(strict=True)
    def list_dir() -> str:
        """List every file of the project."""
        return "\n".join(sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()))

    @tool(lenient=True)
    def read_file(path: str = "README.md") -> str:
        """Read a project file.

        Args:
            path: File path relative to the project root.
        """
        target = inside(path)
        return target.read_text()[:MAX_OUTPUT] if target.is_file() else f"no such file: {path}"

    @tool(lenient=True)
    def grep(pattern: str = "TODO") -> str:
        """Find lines containing a string.

        Args:
            pattern: The text to look for.
        """
        hits = [
            f"{p.relative_to(root)}:{n}: {line}"
            for p in sorted(root.rglob("*.*"))
            for n, line in enumerate(p.read_text().splitlines(), 1)
            if pattern in line
        ]
        return "\n".join(hits)[:MAX_OUTPUT] or "no matches"

    @tool(strict=True, timeout=60, expected_seconds=2.0)
    def run_tests() -> str:
        """Run the project's unit tests."""
        done = subprocess.run(
            [sys.executable, "-m", "unittest", "-q"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=50,
        )
        return (done.stdout + done.stderr)[-MAX_OUTPUT:]

    return [list_dir, read_file, grep, run_tests]


class Narrator(RunHooks):
    """Prints the loop as it runs (the OpenAI Agents SDK's hook signatures)."""

    async def on_tool_start(self, context: RunContext, agent: Agent, tool: Tool) -> None:
        arguments = context.tool_call.arguments if context.tool_call else ""
        print(f"  [{context.branch}] {tool.name}({arguments[:40]})")

    async def on_tool_end(self, context: RunContext, agent: Agent, tool: Tool, result: str) -> None:
        first_line = result.splitlines()[0] if result else ""
        print(f"  [{context.branch}] {tool.name} -> {first_line[:60]!r}")


async def main(base_url: str, model: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp).resolve() / "project"
        root.mkdir()
        for name, text in PROJECT.items():
            (root / name).write_text(text)
        agent = Agent(
            name="coder",
            instructions=(
                "You are a careful coding agent. Explore the project, run its tests, "
                "and explain what is wrong before proposing a fix."
            ),
            model=model,
            tools=make_tools(root),
            # Random weights would call tools (or not) at random: force three named tools,
            # then an answer. With a real model, stop the schedule after the forced turns
            # and let it decide ("auto").
            model_settings=ModelSettings(
                tool_choice=["list_dir", "run_tests", "list_dir", "none"], max_tokens=128
            ),
        )
        client = HintedAsyncOpenAI(base_url=base_url, api_key="unused")
        session = SQLiteSession("coding-demo", root.parent / "session.db")
        for question in ["Why do the tests fail?", "Check again, please."]:
            print(f"user: {question}")
            result = await Runner.run(
                agent, question, client=client, session=session, hooks=Narrator()
            )
            usage = result.usage
            print(f"coder: {result.final_output[:120]!r}")
            print(
                f"  {usage.requests} requests, {usage.input_tokens} input tokens, "
                f"{usage.cached_tokens} served from the prefix cache\n"
            )
        stats = await session.get_stats()
        print(f"session {session.session_id}: {stats.usage.cached_tokens} cached tokens in total")
        session.close()
        await client.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--model", default="tiny")
    args = parser.parse_args()
    anyio.run(main, args.base_url, args.model)
