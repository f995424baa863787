"""Adapters for other agent frameworks; each module imports its framework on import only."""
