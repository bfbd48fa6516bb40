#!/usr/bin/env bash
# The trainer on a CUDA GPU, in one command (docs/gpu_check.md, "The trainer on a GPU"):
#   1. `ci_tiny_lora` with the GPU's default (bf16 mixed precision) and with `--bf16 false`: the sampler-trainer gap;
#   2. GRPO steps on a model of the Qwen2.5-1.5B shape with random weights, synchronous and asynchronous;
#   3. the in-process test lane (pytest-xdist when installed), from a copy of tests/ against the installed package.
# Each part has its own time limit; everything lands in OUT_DIR (logs, metrics.jsonl, the tests' JUnit XML).
#
#   bash scripts/gpu_trainer_check.sh OUT_DIR [--wheels DIR] [--steps N] [--tests-seconds S]
#
# It needs torch with CUDA and the package installed with its training dependencies (`pip install .`). On a machine
# where nothing can be installed from an index, `--wheels DIR` installs the wheels in DIR (the package's own, trl,
# datasets, ...) into a private folder first, without their dependencies.
set -uo pipefail
usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
[[ ${1:-} == -h || ${1:-} == --help ]] && usage 0
[[ $# -ge 1 && $1 != -* ]] || usage 2
out=$(mkdir -p "$1" && cd "$1" && pwd); shift
wheels="" steps=4 tests_seconds=300
while [[ $# -gt 0 ]]; do
    case $1 in
        --wheels) wheels=$(cd "$2" && pwd); shift 2 ;;
        --steps) steps=$2; shift 2 ;;
        --tests-seconds) tests_seconds=$2; shift 2 ;;
        -h|--help) usage ;;
        *) echo "error: unknown argument $1" >&2; usage 2 ;;
    esac
done
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON=${PYTHON:-python3}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
start=$(date +%s)
say() { echo "[$(($(date +%s) - start))s] $*" | tee -a "$out/summary.txt"; }

if [[ -n $wheels ]]; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$out/site" \
        "$wheels"/*.whl || { echo "error: could not install the wheels in $wheels" >&2; exit 1; }
    export PYTHONPATH="$out/site${PYTHONPATH:+:$PYTHONPATH}"
fi
"$PYTHON" - <<'EOF' 2>&1 | tee -a "$out/summary.txt" || exit 1
import sys
import torch
if not torch.cuda.is_available():
    sys.exit("error: no CUDA GPU: this check is for a GPU machine (scripts/gpu_check.sh --tiny runs on CPU)")
import accelerate, peft, transformers, trl, agentic_grpo  # noqa: E401, F401
print("device", torch.cuda.get_device_name(), "torch", torch.__version__, "cuda", torch.version.cuda,
      "transformers", transformers.__version__, "trl", trl.__version__, "peft", peft.__version__)
EOF

work="$out/work"
mkdir -p "$work"
cp "$root/train.py" "$work/"
gap() {  # the canary's mean gap per step, from a run's metrics
    "$PYTHON" -c "import json,sys; print(' '.join(f\"{json.loads(l).get('canary/logprob_diff/mean', float('nan')):.2g}\" for l in open(sys.argv[1])))" \
        "$1/metrics.jsonl" 2>/dev/null || echo "no metrics"
}
train() {  # name, seconds, arguments...
    local name=$1 seconds=$2; shift 2
    (cd "$work" && timeout "$seconds" "$PYTHON" train.py --output_dir "$work/$name" --overwrite_output_dir true "$@" \
        > "$out/$name.log" 2>&1)
    local rc=$?
    cp "$work/$name/metrics.jsonl" "$out/$name.metrics.jsonl" 2>/dev/null
    say "$name: exit $rc, canary gap per step: $(gap "$work/$name")"
}

say "1. ci_tiny_lora, bf16 mixed precision (the default on a GPU), then fp32"
train lora-bf16 120 --config ci_tiny_lora
train lora-fp32 120 --config ci_tiny_lora --bf16 false

say "2. a Qwen2.5-1.5B-shaped model with random weights, synchronous and asynchronous"
"$PYTHON" - "$work/q15" <<'EOF' >> "$out/summary.txt" 2>&1
import dataclasses
import sys
from pathlib import Path

import torch
from agentic_grpo.benchmarks._gpu_parts import QWEN_1P5B, build_model, tests_tokenizer

target = Path(sys.argv[1])
tokenizer = tests_tokenizer(target.parent)  # the tests' tokenizer: its own vocabulary, not Qwen's
shape = dataclasses.replace(QWEN_1P5B, vocab=0)
build_model(shape, tokenizer, torch.bfloat16, torch.device("cpu")).save_pretrained(target)
tokenizer.save_pretrained(target)
print("built", target)
EOF
shape=(--config ci_tiny_lora --model_name_or_path "$work/q15" --max_steps "$steps" --num_generations 8
       --per_device_train_batch_size 16 --max_turns 2 --max_tokens_per_turn 96 --max_completion_length 256
       --bf16 true --save_steps 1000 --lora_r 16 --lora_alpha 32)
train q15-sync 300 "${shape[@]}"
train q15-async 300 "${shape[@]}" --async_rollouts true

say "3. the in-process test lane"
# A copy of the checkout without its `agentic_grpo/` folder, which would shadow the installed package (whose
# `agentic_grpo.tools` and `.rewards` are the checkout's tools/ and rewards/).
mkdir -p "$work/tree"
tar -C "$root" --exclude=./agentic_grpo --exclude=./.git --exclude=./.venv --exclude=./outputs --exclude=./.whl \
    -cf - . | tar -C "$work/tree" -xf -
workers=()
"$PYTHON" -c "import xdist" 2>/dev/null && workers=(-n 12)
(cd "$work/tree" && timeout "$tests_seconds" "$PYTHON" -m pytest -p no:cacheprovider "${workers[@]}" -q -rfE --tb=line \
    --junitxml="$out/tests.xml" > "$out/tests.log" 2>&1)
say "tests: exit $?, $(grep -E '(passed|failed)' "$out/tests.log" | tail -1)"
