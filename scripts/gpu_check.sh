#!/usr/bin/env bash
# The GPU check (benchmarks/gpu.py): GRPO steps on Qwen2.5-shaped random models, fp32 token identity and the
# bf16 sampler-trainer log-prob gap on CUDA; prints one JSON object and writes it to --out. docs/gpu_check.md.
#
#   bash scripts/gpu_check.sh --out gpu.json          # on the GPU machine, from a copy of the checkout
#   bash scripts/gpu_check.sh --tiny --out gpu.json   # tiny shapes on CPU (what the tests run)
#
# Nothing needs installing where torch, transformers, accelerate and peft are: the checkout itself is put on
# the path. PYTHON picks the interpreter (default: the checkout's .venv, else python3).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$root/.venv/bin/python" ]]; then PYTHON="$root/.venv/bin/python"; else PYTHON=python3; fi
fi
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
exec "$PYTHON" "$root/benchmarks/gpu.py" "$@"
