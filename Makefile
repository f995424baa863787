# The two set-up commands of the README; both bootstrap a fresh machine first.
.PHONY: demo test check bench bootstrap

bootstrap:
	@scripts/bootstrap.sh

# ARGS: more flags, e.g. ARGS="--claude-code ~/.claude/projects" (python -m examples.demo --help).
demo: bootstrap
	.venv/bin/python -m examples.demo $(ARGS)

test: bootstrap
	.venv/bin/python -m pytest

check: bootstrap
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy

# The matrix of docs/benchmarks.md: 8 traces at 1/16 scale, a third of their working set.
bench: bootstrap
	.venv/bin/python -m benchmarks.replay --n-traces 8 --scale-k 4 --time-scale 10 \
	  --max-think 30 --kv-blocks 256 --block-size 64 --max-model-len 8192 \
	  --extension-config '{"max_held_fraction": 1.0, "max_tenant_fraction": 1.0, "max_defer_s": 20}' \
	  --out results/matrix.json
