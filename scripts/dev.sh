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
# optimum-onnx exports Hugging Face decoders with their key/value cache (the GGUF tests,
# scripts/optimum_export.py). Its only release needs transformers < 4.58, so it goes with its
# transformers, tokenizers and huggingface_hub into a folder of its own that the script puts first
# on sys.path; the environment keeps its transformers 5.
overlay="$VENV/optimum-onnx"
if [ ! -f "$overlay/.complete" ]; then
  "$VENV/bin/python" -m pip install --quiet --no-deps --target "$overlay" transformers==4.57.6 tokenizers==0.22.2 \
    huggingface_hub==0.36.2 optimum==2.1.0 optimum-onnx==0.1.0 && touch "$overlay/.complete" \
    || echo "warning: optimum-onnx not installed; the GGUF export tests will skip" >&2
fi
# timm and Ultralytics export the vision models the GGML robustness tests run
# (scripts/vision_export.py). They need torchvision, whose only wheel for this torch is a CUDA
# build that cannot load its ops with the CPU torch (importing it fails): so all three go, without
# dependencies, with the few of theirs the environment lacks, into a folder of their own that only
# the script puts on sys.path (it declares the two ops torchvision's Python code needs).
overlay="$VENV/vision"
if [ ! -f "$overlay/.complete" ]; then
  "$VENV/bin/python" -m pip install --quiet --no-deps --target "$overlay" timm==1.0.31 torchvision==0.28.0 \
    ultralytics==8.4.190 ultralytics-thop==2.2.3 opencv-python-headless==5.1.0.95 psutil==7.2.2 \
    && touch "$overlay/.complete" || echo "warning: timm/ultralytics not installed; their export tests will skip" >&2
fi
# The long tier runs llama.cpp on the GGUF files Mithril writes: llama-cpp-python, a source build
# (several minutes), only when the long tier is asked for.
if [ "${MITHRIL_LONG_TESTS:-0}" = "1" ] && ! "$VENV/bin/python" -c "import llama_cpp" 2>/dev/null; then
  echo "building llama-cpp-python (the long tier's GGUF checks)" >&2
  CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_CURL=OFF" \
    nice -n 10 "$VENV/bin/python" -m pip install --quiet --no-binary llama-cpp-python -c constraints.txt \
    llama-cpp-python==0.3.36 || echo "warning: llama-cpp-python did not build; its GGUF tests will skip" >&2
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
