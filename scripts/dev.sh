#!/usr/bin/env bash
# Set up the development environment (once) and run a job in it.
#   bash scripts/dev.sh demo    # the main job: export ResNet-18, run on every backend, validate
#   bash scripts/dev.sh test    # the test suite
#   bash scripts/dev.sh shell   # a shell inside the environment
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${MITHRIL_VENV:-.venv}
PY=${PYTHON:-python3}

if [ ! -x "$VENV/bin/python" ]; then
  echo "creating $VENV" >&2
  "$PY" -m venv "$VENV"
fi
# Reinstall only when the dependency files change.
stamp="$VENV/.mithril-deps-$(cat pyproject.toml constraints.txt scripts/patches/*.patch | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "installing dependencies into $VENV (CPU torch pinned by constraints.txt)" >&2
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  # ggml-python is a source build (about 2 minutes): first, with llamafile's matmuls (1.5-2.5x
  # faster) and ggml's AMX matmul fixed (scripts/patches: as published it dies with SIGILL).
  src=$(mktemp -d)
  "$VENV/bin/python" -m pip download --quiet --no-deps --no-binary :all: -c constraints.txt ggml-python -d "$src"
  tar -xzf "$src"/ggml_python-*.tar.gz -C "$src"
  for p in scripts/patches/ggml-*.patch; do patch --quiet --forward -p1 -d "$src"/ggml_python-*/ < "$p"; done
  "$VENV/bin/python" -m pip install --quiet -c constraints.txt "$src"/ggml_python-*/ \
    --config-settings=cmake.args=-DGGML_LLAMAFILE=ON
  rm -rf "$src"
  "$VENV/bin/python" -m pip install --quiet -c constraints.txt -e ".[all]"
  rm -f "$VENV"/.mithril-deps-*
  touch "$stamp"
fi
export PATH="$PWD/$VENV/bin:$PATH"

job=${1:-demo}
shift || true
case "$job" in
  demo) exec python scripts/main_job.py "$@" ;;
  # Two pytest workers, a test module each at a time (module fixtures built once): C builds, exports
  # and subprocesses leave a core idle in a single process. MITHRIL_TEST_WORKERS=0 runs in one.
  test) exec python -m pytest -q -n "${MITHRIL_TEST_WORKERS:-2}" --dist loadscope "$@" ;;
  shell) exec "${SHELL:-bash}" ;;
  *) echo "usage: bash scripts/dev.sh {demo|test|shell} [args...]" >&2; exit 2 ;;
esac
