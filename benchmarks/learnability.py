"""Is the synthetic note-search log learnable, not noise? -> benchmarks/results/learnability.json

TwinBERT (MiniLM query + document towers, 128-d head) is trained on the triplets that
``scalingnote data build`` makes from the SYNTHETIC log (the quick-start defaults, seed 0) and
evaluated on the synthetic test queries, against two references:

* ``init``: the same towers before training (pre-trained MiniLM + centre + PCA head), and
* a control trained for the same steps on the same triplets with the positives and hard
  negatives shuffled across queries (labels destroyed, texts and step budget kept).

Learnable data = training on the real triplets beats both. Rows: one per triplet set.

    python -m benchmarks.learnability [--steps 120] [--batch-size 16]
"""

from __future__ import annotations

import argparse
import random

from benchmarks._common import REPO_ROOT, write_results


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    from scalingnote.config import load_config
    from scalingnote.data.triplets import load_triplets, write_triplets
    from scalingnote.data.types import Triplet
    from scalingnote.quickstart import QuickstartConfig, prepare_data
    from scalingnote.training import TrainConfig, train

    work = REPO_ROOT / ".cache" / "bench" / "learnability"
    qc = QuickstartConfig(out=str(work), seed=args.seed, show_progress=False)
    data = prepare_data(qc, work)  # the quick-start synthetic log and its triplets
    real = load_triplets(data["triplets"])
    rng = random.Random(args.seed)
    docs = [t.pos_id for t in real]
    negs = [t.neg_id for t in real]
    rng.shuffle(docs)
    rng.shuffle(negs)
    shuffled = [
        Triplet(t.query_id, p, n if n != p else None, "shuffled") for t, p, n in zip(real, docs, negs, strict=True)
    ]
    shuffled_path = work / "shuffled_train.jsonl"
    write_triplets(shuffled_path, shuffled)

    rows = []
    for name, path in (("real", data["triplets"]), ("shuffled", str(shuffled_path))):
        cfg = load_config(
            TrainConfig,
            {
                "method": "twinbert",
                "output_dir": str(work / f"twinbert_{name}"),
                "query_tower": {"model": qc.bert, "max_length": qc.query_max_length},
                "doc_tower": {"model": qc.bert, "max_length": qc.doc_max_length},
                "data": {
                    "data_dir": data["beir"],
                    "triplets": path,
                    "validation_triplets": data["validation_triplets"],
                    "eval_split": "test",
                },
                "optim": {
                    "batch_size": args.batch_size,
                    "max_steps": args.steps,
                    "epochs": 1000.0,
                    "lr": qc.bert_lr,
                    "head_lr": qc.head_lrs[-1],
                },
                "seed": args.seed,
                "save_every": 20,
                "evaluate_zero_shot": True,
                "show_progress": False,
            },
        )
        res = train(cfg, resume=True)
        rows.append(
            {
                "triplets": name,
                "train_examples": res["train_examples"],
                "steps": res["total_steps"],
                "init_ndcg@10": round(res["zero_shot_ndcg@10"], 4),
                "init_r@100": round(res["zero_shot_r@100"], 4),
                "ndcg@10": round(res["ndcg@10"], 4),
                "r@100": round(res["r@100"], 4),
                "mrr@10": round(res["mrr@10"], 4),
                "val_contrastive_ppl": round(res["val_contrastive_ppl"], 4),
                "train_seconds": res["train_seconds"],
            }
        )
        print(rows[-1], flush=True)
    write_results(
        "learnability",
        rows,
        {
            "data": "synthetic note-search log (quick-start defaults: 1500 notes, 800 queries, seed 0) -> "
            "triplets via scalingnote data build",
            "model": "twinbert: minilm-l6 query + document towers, 128-d head (centre + PCA init)",
            "steps": args.steps,
            "batch_size": args.batch_size,
            "lr": qc.bert_lr,
            "head_lr": qc.head_lrs[-1],
            "control": "same triplets with positives and hard negatives shuffled across queries",
            "eval": "synthetic test queries (qrels/test.tsv), exact search over the whole corpus",
            "seed": args.seed,
        },
    )


if __name__ == "__main__":
    main()
