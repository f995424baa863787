# The two set-up commands of the README; both bootstrap a fresh machine first.
.PHONY: demo test check bench bootstrap

bootstrap:
	@scripts/bootstrap.sh

demo: bootstrap
	.venv/bin/python -m examples.demo

test: bootstrap
	.venv/bin/python -m pytest

check: bootstrap
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy

bench: bootstrap
	.venv/bin/python -m benchmarks.replay
