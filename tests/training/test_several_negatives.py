"""Several hard negatives per query: the losses (n = 1 unchanged, n = 3 against hand
recomputations), the BM25 data path and the trainer's gradient caching with n = 3."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from scalingnote.config import load_config
from scalingnote.data import load_qrels, load_queries
from scalingnote.models import build_tiny_model
from scalingnote.sparse.bm25 import BM25Retriever, sample_hard_negatives
from scalingnote.training import TrainConfig, build_towers
from scalingnote.training.config import DataSpec
from scalingnote.training.data import load_training_data
from scalingnote.training.losses import LossBatch, LossSpec, get_loss, matryoshka_contrastive
from scalingnote.training.trainer import Trainer
from tests.helpers.tiny_data import write_tiny_beir


def _views(g, b, dim, rows=None):
    return {v: torch.randn(rows or b, dim, generator=g, dtype=torch.float64) for v in ("title", "content", "emb")}


def test_one_negative_is_bit_identical_to_the_pinned_eq12():
    """n = 1 through LossBatch equals the one-negative Eq. 12 written out as it was before
    several negatives existed (the same operations, so the same bits)."""
    g = torch.Generator().manual_seed(4)
    q = torch.randn(6, 32, generator=g)
    pos, neg = {k: v.float() for k, v in _views(g, 6, 32).items()}, {k: v.float() for k, v in _views(g, 6, 32).items()}
    spec = LossSpec(dims=[16, 32])
    loss, comps = get_loss("scalingnote")(LossBatch(q, pos, neg), spec)
    con = sum(matryoshka_contrastive(q, pos[v], dims=[16, 32], tau=spec.tau) for v in pos)
    hard = q.new_zeros(())
    for v in pos:
        part = q.new_zeros(())
        for m in (16, 32):
            qm, pm, nm = (F.normalize(x[:, :m], dim=-1) for x in (q, pos[v], neg[v]))
            part = part + 1.0 * F.relu(spec.margin - (qm * pm).sum(-1) + (qm * nm).sum(-1)).mean()
        hard = hard + part
    assert torch.equal(loss, con + spec.alpha * hard)
    assert comps["loss_hard"] == float(hard)


def _hand_hard(q, pos, neg, n, dims, margin, reduce):
    """Eq. 9/10 by loops: per prefix, per query, the hinge over its n negatives (mean or max)."""
    total = 0.0
    for m in dims:
        per_q = []
        for i in range(q.shape[0]):
            qi = F.normalize(q[i, :m], dim=0)
            sp = float(qi @ F.normalize(pos[i, :m], dim=0))
            h = [max(0.0, margin - sp + float(qi @ F.normalize(neg[i * n + j, :m], dim=0))) for j in range(n)]
            per_q.append(sum(h) / n if reduce == "mean" else max(h))
        total += sum(per_q) / len(per_q)
    return total


@pytest.mark.parametrize("reduce", ["mean", "max"])
def test_three_negatives_scalingnote_loss_matches_a_hand_recomputation(reduce):
    g = torch.Generator().manual_seed(5)
    b, n, dims = 4, 3, [8, 16]
    q = torch.randn(b, 16, generator=g, dtype=torch.float64)
    pos, neg = _views(g, b, 16), _views(g, b, 16, rows=b * n)
    spec = LossSpec(dims=dims, hard_reduce=reduce, margin=0.9, hard_in_denominator=True)
    batch = LossBatch(q, pos, neg)
    assert batch.num_negatives == 3
    loss, comps = get_loss("scalingnote")(batch, spec)
    hard = sum(_hand_hard(q, pos[v], neg[v], n, dims, 0.9, reduce) for v in pos)
    assert comps["loss_hard"] == pytest.approx(hard, abs=1e-9)
    # every negative (all B*n) joins the Eq. 5 denominators with hard_in_denominator
    con = sum(float(matryoshka_contrastive(q, pos[v], neg_all=neg[v], dims=dims, tau=spec.tau)) for v in pos)
    assert comps["loss_con"] == pytest.approx(con, abs=1e-9)
    assert float(loss) == pytest.approx(con + 0.5 * hard, abs=1e-9)


def test_three_negatives_infonce_matches_a_hand_recomputation():
    g = torch.Generator().manual_seed(6)
    b, n, tau = 3, 3, 0.1
    q = torch.randn(b, 8, generator=g, dtype=torch.float64)
    pos, neg = (
        torch.randn(b, 8, generator=g, dtype=torch.float64),
        torch.randn(b * n, 8, generator=g, dtype=torch.float64),
    )
    _, comps = get_loss("infonce")(
        LossBatch(q, {"emb": pos}, {"emb": neg}), LossSpec(name="infonce", dims=[8], tau=tau)
    )
    cands = [F.normalize(x, dim=0) for x in torch.cat([pos, neg])]
    want = 0.0
    for i in range(b):
        qi = F.normalize(q[i], dim=0)
        logits = [float(qi @ c) / tau for c in cands]
        want += -(logits[i] - math.log(sum(math.exp(x) for x in logits)))
    assert comps["loss"] == pytest.approx(want / b, abs=1e-9)


def test_loss_batch_refuses_negatives_that_are_not_a_multiple_of_the_queries():
    q = torch.randn(4, 8)
    with pytest.raises(ValueError, match="B\\*n rows"):
        LossBatch(q, {"emb": q}, {"emb": torch.randn(6, 8)})


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_negs")
    return {
        "llm": str(build_tiny_model(root / "llm", "llm", num_layers=2)),
        "data": str(write_tiny_beir(root / "beir")),
    }


def test_bm25_one_negative_is_todays_draw_and_three_come_from_the_same_window(tiny):
    spec = DataSpec(tiny["data"], neg_skip_top=1, neg_max_rank=8, validation_fraction=0.0)
    one = load_training_data(spec, seed=3, show_progress=False)
    qrels = load_qrels(f"{tiny['data']}/qrels/train.tsv")
    queries = {q.id: q.text for q in load_queries(f"{tiny['data']}/queries.jsonl").values()}
    positives = {q: [d for d, g in docs.items() if g > 0] for q, docs in qrels.items()}
    run = BM25Retriever.fit(one.corpus.values(), show_progress=False).search(
        {q: queries[q] for q in positives}, k=8, show_progress=False
    )
    want = []
    for i, (qid, ps) in enumerate(sorted(positives.items())):  # the draw as it was made before several negatives
        for j, pid in enumerate(sorted(ps)):
            want.append(
                (
                    qid,
                    pid,
                    sample_hard_negatives({qid: run.get(qid, {})}, positives, 1, 8, seed=3 * 1_000_003 + i * 101 + j)[
                        qid
                    ],
                )
            )
    assert [(e.query_id, e.pos.id, e.neg.id if e.neg else None) for e in one.train] == want
    assert all(e.extra_negs == () for e in one.train)
    three = load_training_data(
        DataSpec(tiny["data"], neg_skip_top=1, neg_max_rank=8, validation_fraction=0.0, num_negatives=3),
        seed=3,
        show_progress=False,
    )
    for e in three.train:
        window = [d for d, _ in sorted(run[e.query_id].items(), key=lambda x: (-x[1], x[0]))][1:8]
        assert len(e.negs) == 3 and len(set(d.id for d in e.negs)) == 3
        assert {d.id for d in e.negs} <= set(window) and not {d.id for d in e.negs} & set(positives[e.query_id])


def _full_and_cached_gradients(tiny, tmp_path, num_negatives, edit=lambda batch: batch):
    """One step's loss components and gradients on the same batch (``edit`` may change it), on
    the full batch of 6 and with gradient caching in micro-batches of 4."""
    base = {
        "method": "scaling_dual",
        "query_tower": {"model": tiny["llm"], "max_length": 16},
        "doc_tower": {"model": tiny["llm"], "max_length": 64},
        "dim": 32,
        "loss": {"dims": [16, 32], "hard_in_denominator": True},
        "data": {
            "data_dir": tiny["data"],
            "neg_skip_top": 1,
            "neg_max_rank": 8,
            "validation_fraction": 0.0,
            "num_negatives": num_negatives,
        },
        "seed": 3,
        "show_progress": False,
    }
    cfg_full = load_config(TrainConfig, {**base, "output_dir": str(tmp_path / "a"), "optim": {"batch_size": 6}})
    cfg_gc = load_config(
        TrainConfig, {**base, "output_dir": str(tmp_path / "b"), "optim": {"batch_size": 6, "micro_batch_size": 4}}
    )
    data = load_training_data(cfg_full.data, cfg_full.seed, show_progress=False)
    out = []
    for cfg in (cfg_full, cfg_gc):
        torch.manual_seed(0)
        q, d = build_towers(cfg)
        tr = Trainer(cfg, q, d, data.train)
        comps = tr.compute_gradients(edit(tr._batch_for_step(0)))
        out.append((comps, {n: p.grad.clone() for t in (q, d) for n, p in t.named_parameters() if p.grad is not None}))
    (c1, g1), (c2, g2) = out
    assert abs(c1["loss"] - c2["loss"]) < 1e-5
    assert g1.keys() == g2.keys()
    for k in g1:
        torch.testing.assert_close(g1[k], g2[k], atol=1e-5, rtol=1e-4, msg=k)
    return c1


def test_gradient_cache_equals_full_batch_with_three_negatives(tiny, tmp_path):
    assert _full_and_cached_gradients(tiny, tmp_path, 3)["loss_hard"] > 0


@pytest.mark.parametrize("reduce", ["mean", "max"])
def test_padded_negatives_are_left_out_of_both_terms(reduce):
    """A batch padded to n = 2 (query 0 has two negatives, query 1 one, query 2 none): the hinge
    runs over the three real triplets only and the denominators take the three real rows; the
    padding's content does not matter."""
    g = torch.Generator().manual_seed(7)
    b, n, dims = 3, 2, [8, 16]
    q = torch.randn(b, 16, generator=g, dtype=torch.float64)
    pos, neg = _views(g, b, 16), _views(g, b, 16, rows=b * n)
    mask = torch.tensor([True, True, True, False, False, False])
    spec = LossSpec(dims=dims, hard_reduce=reduce, margin=0.9, hard_in_denominator=True)
    _, comps = get_loss("scalingnote")(LossBatch(q, pos, neg, neg_mask=mask), spec)
    junk = {v: t.clone() for v, t in neg.items()}
    for t in junk.values():
        t[~mask] = 1e3 * torch.randn(int((~mask).sum()), 16, generator=g, dtype=torch.float64)
    _, comps_junk = get_loss("scalingnote")(LossBatch(q, pos, junk, neg_mask=mask), spec)
    assert comps == pytest.approx(comps_junk, abs=1e-12)
    want_hard = 0.0
    for (
        v
    ) in pos:  # by hand: query 0 over its 2 negatives, query 1 over its 1, query 2 left out (max) / not counted (mean)
        for m in dims:
            qn, pn, nn_ = (F.normalize(x[:, :m], dim=-1) for x in (q, pos[v], neg[v]))
            h = [
                [max(0.0, 0.9 - float(qn[i] @ pn[i]) + float(qn[i] @ nn_[r])) for r in rows]
                for i, rows in ((0, (0, 1)), (1, (2,)))
            ]
            want_hard += sum(map(sum, h)) / 3 if reduce == "mean" else (max(h[0]) + max(h[1])) / 2
    assert comps["loss_hard"] == pytest.approx(want_hard, abs=1e-9)
    con = sum(float(matryoshka_contrastive(q, pos[v], neg_all=neg[v][mask], dims=dims, tau=spec.tau)) for v in pos)
    assert comps["loss_con"] == pytest.approx(con, abs=1e-9)
    _, inf = get_loss("infonce")(
        LossBatch(q, {"emb": pos["emb"]}, {"emb": neg["emb"]}, neg_mask=mask), LossSpec(name="infonce", dims=[16])
    )
    _, inf_real = get_loss("infonce")(
        LossBatch(q, {"emb": pos["emb"]}, {"emb": neg["emb"][:3]}), LossSpec(name="infonce", dims=[16])
    )
    assert inf["loss"] == pytest.approx(inf_real["loss"], abs=1e-12)  # 3 real rows as candidates either way
    with pytest.raises(ValueError, match="neg_mask"):
        LossBatch(q, pos, neg, neg_mask=mask[:4])


def test_an_example_without_a_negative_no_longer_drops_the_batchs(tiny, tmp_path):
    """One example of the batch without a hard negative: the others keep theirs (padded + masked;
    before, n = min over the batch = 0 and the whole batch trained without), and gradient caching
    still equals the full batch."""
    import dataclasses

    from scalingnote.training.trainer import negative_mask

    seen = []

    def short(batch):
        batch[1] = dataclasses.replace(batch[1], neg=None, extra_negs=())  # no negative
        batch[4] = dataclasses.replace(batch[4], extra_negs=())  # one of two
        assert negative_mask(batch, 2).tolist() == [True] * 2 + [False] * 2 + [True] * 4 + [True, False] + [True] * 2
        seen.append(batch)
        return batch

    assert _full_and_cached_gradients(tiny, tmp_path, 2, short)["loss_hard"] > 0
    assert negative_mask(seen[0][:1], 2) is None
