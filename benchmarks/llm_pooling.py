"""Zero-shot SmolLM2 embeddings by depth and pooling -> benchmarks/results/llm_pooling_scifact.json

Why do the LLM towers use mean pooling on CPU? The paper's placeholder pooling reads one
hidden state (the last query token / the state before ``[EMB]``); an untrained, truncated
decoder's state there is nearly the same for every text. This measures, without any
training, nDCG@10 / Recall@100 of SmolLM2-135M at depths 1..16 with

* ``placeholder``: the §3.2 positions (query: last token = EOS; document: before ``[EMB]``),
* ``mean``: the mean over the query tokens / over the whole §3.2 prompt,

each as raw states, centred (each side's mean removed) and centred + whitened (PCA
whitening over both sides). One forward pass at the deepest layer gives every depth (the
model's final norm applied to each intermediate state = the truncated model).

Pool: the first ``--queries`` SciFact test queries with qrels, their relevant documents and
``--distractors`` random others (a sub-corpus: absolute numbers are higher than on the
full corpus; the comparison between rows is the point).

    python -m benchmarks.llm_pooling [--queries 150] [--distractors 700] [--max-layers 16]
"""

from __future__ import annotations

import argparse
import random
import time

from benchmarks._common import shared_data_dir, write_results


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--queries", type=int, default=150)
    ap.add_argument("--distractors", type=int, default=700)
    ap.add_argument("--max-layers", type=int, default=16)
    ap.add_argument("--doc-max-length", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args()


def pooled_states(tower, batch, pos, depths: list[int], max_layers: int, norm) -> dict:
    """``{depth: {"placeholder": state at pos, "mean": mean over the attended tokens}}`` of one batch."""
    import torch

    hs = tower.backbone(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=batch["position_ids"],
        use_cache=False,
        output_hidden_states=True,
    ).hidden_states
    m = batch["attention_mask"].unsqueeze(-1).float()
    rows = torch.arange(m.shape[0])
    out = {}
    for L in depths:
        h = hs[L] if L == max_layers else norm(hs[L])  # HF applies the final norm to the last layer's output only
        out[L] = {"placeholder": h[rows, pos], "mean": (h * m).sum(1) / m.sum(1)}
    return out


def encode_pool(qt, dt, texts: list[str], docs: list, depths: list[int], args) -> dict:
    """Every depth's placeholder and mean states of the queries (``q``) and documents (``d``)."""
    import torch

    norm = qt.backbone.norm
    acc: dict = {side: {L: {"placeholder": [], "mean": []} for L in depths} for side in ("q", "d")}
    with torch.no_grad():
        for i in range(0, len(texts), 32):
            b = qt.tokenize_queries(texts[i : i + 32])
            m = b["attention_mask"]
            last = (m * torch.arange(m.shape[1])).argmax(-1)
            for L, v in pooled_states(qt, b, last, depths, args.max_layers, norm).items():
                for k in v:
                    acc["q"][L][k].append(v[k])
        for i in range(0, len(docs), 16):
            b = dt.tokenize_documents(docs[i : i + 16], max_length=args.doc_max_length)
            for L, v in pooled_states(dt, b, b["view_positions"][:, 2], depths, args.max_layers, norm).items():
                for k in v:
                    acc["d"][L][k].append(v[k])
    return acc


def score(qe, de, mode: str, qids: list[str], dids: list[str], qrels: dict) -> dict:
    """nDCG@10 / Recall@100 of cosine search over raw, centred or whitened states."""
    import numpy as np
    import torch

    from scalingnote.evaluation import evaluate

    qe, de = qe.double(), de.double()
    if mode != "raw":
        qe, de = qe - qe.mean(0), de - de.mean(0)
    if mode == "whiten":
        x = torch.cat([qe, de])
        e, v = torch.linalg.eigh(x.T @ x / len(x) + 1e-6 * torch.eye(x.shape[1], dtype=x.dtype))
        w = v / e.clamp(min=1e-8).sqrt()
        qe, de = qe @ w, de @ w
    s = (torch.nn.functional.normalize(qe, dim=-1) @ torch.nn.functional.normalize(de, dim=-1).T).numpy()
    run = {q: {dids[j]: float(s[i, j]) for j in np.argsort(-s[i])[:100]} for i, q in enumerate(qids)}
    return evaluate(run, {q: qrels[q] for q in qids}, ["ndcg@10", "recall@100"])


def main() -> None:
    args = parse_args()

    import torch

    from scalingnote.data import load_beir
    from scalingnote.models import load_tower_pair

    torch.set_num_threads(2)
    ds = load_beir(shared_data_dir() / "scifact", "test")
    qids = sorted(ds.qrels)[: args.queries]
    rel = {d for q in qids for d in ds.qrels[q]}
    others = [d for d in sorted(ds.corpus) if d not in rel]
    dids = sorted(rel) + random.Random(args.seed).sample(others, min(args.distractors, len(others)))
    depths = [d for d in (1, 2, 4, 8, 16, 30) if d <= args.max_layers]
    qt, dt = load_tower_pair("smollm2-135m", num_layers=args.max_layers)

    t0 = time.perf_counter()
    texts = [ds.queries[q].text for q in qids]
    docs = [ds.corpus[d] for d in dids]
    acc = encode_pool(qt, dt, texts, docs, depths, args)
    encode_s = time.perf_counter() - t0

    rows = []
    for L in depths:
        for pooling in ("placeholder", "mean"):
            qe, de = torch.cat(acc["q"][L][pooling]), torch.cat(acc["d"][L][pooling])
            cos = torch.nn.functional.normalize(de.double(), dim=-1)
            mean_cos = float((cos @ cos.T).mean())
            for mode in ("raw", "centred", "whitened"):
                r = score(qe, de, {"raw": "raw", "centred": "center", "whitened": "whiten"}[mode], qids, dids, ds.qrels)
                rows.append(
                    {
                        "layers": L,
                        "pooling": pooling,
                        "states": mode,
                        "ndcg@10": round(r["ndcg@10"], 4),
                        "recall@100": round(r["recall@100"], 4),
                        "doc_mean_pairwise_cos": round(mean_cos, 4),
                    }
                )
                print(rows[-1], flush=True)
    write_results(
        "llm_pooling_scifact",
        rows,
        {
            "model": "smollm2-135m (GGUF Q4_1 -> fp32), untrained, no projection",
            "queries": len(qids),
            "documents": len(dids),
            "pool": "test queries with qrels, their relevant docs + random distractors",
            "doc_max_length": args.doc_max_length,
            "prompt": "ScalingNote §3.2 document prompt",
            "seed": args.seed,
            "encode_seconds": round(encode_s, 1),
        },
    )


if __name__ == "__main__":
    main()
