"""Which sessions a simulation replays: the benchmarks' own three sources."""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Sequence
from pathlib import Path

from .._claude_code import Session, read_session
from .._sessions import find_source
from .._synthetic import Figures, generated_sessions
from .._traces import load_trace
from ._cluster import ControlStyle
from ._workload import Pacing, Template, from_session, from_trace

__all__ = ["GENERATED_TEMPLATES", "load_templates", "session_templates"]

GENERATED_TEMPLATES = 200
"""Generated sessions drawn as templates (more sessions replay them again)."""


def session_templates(sessions: Sequence[Session], pacing: Pacing) -> list[Template]:
    """Templates of session-model sessions; sessions of one model share its
    system prefix."""
    models: dict[str, int] = {}
    out = []
    for s in sessions:
        index = models.setdefault(s.model, len(models))
        out.append(from_session(s, pacing, index))
    return out


def load_templates(
    args: argparse.Namespace, pacing: Pacing, repo_root: Path
) -> tuple[str, list[Template], ControlStyle]:
    """(description, templates, the hinted client's style) for the CLI's
    source arguments: the transcripts (the SDK's style: ``tools``), the
    traces (the replay's: ``turns``) or the generated sessions (``tools``)."""
    source = find_source(
        repo_root,
        claude_code=args.claude_code,
        traces=args.traces,
        generated=args.generated,
        fallback=True,
    )
    if source.kind == "traces":
        traces = [load_trace(p) for p in sorted(source.path.glob("*.json"))]
        return source.describe(), [from_trace(t, pacing) for t in traces], "turns"
    if source.kind == "claude-code":
        sessions = [read_session(p) for p in sorted(source.path.rglob("*.jsonl"))]
        found = [s for s in sessions if s.num_calls]
    else:
        drawn = generated_sessions(Figures.load(source.path), args.seed)
        found = list(itertools.islice(drawn, GENERATED_TEMPLATES))
    return source.describe(), session_templates(found, pacing), "tools"
