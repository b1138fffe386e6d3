"""The machine calibration behind the budget's first plan (:mod:`scalingnote.quickstart.calibrate`)
and what the first plan does with a slow machine: a proxy drawn within what the rest leaves, no
proxy run for a width the budget cannot train, and a plan that says when it is over."""

from __future__ import annotations

from dataclasses import replace

import torch

import scalingnote.quickstart.calibrate as C
import scalingnote.quickstart.proxy as X
from scalingnote.data.types import Document
from scalingnote.quickstart import QuickstartConfig
from scalingnote.quickstart.budget import Sizes, make_plan
from scalingnote.quickstart.config import family
from scalingnote.quickstart.early import proxy_share_s, proxy_width_runs, sized_proxy


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class _Layer(torch.nn.Module):
    def __init__(self, clock: _Clock, per_token: float) -> None:
        super().__init__()
        self.clock, self.per_token = clock, per_token

    def forward(self, x):
        self.clock.t += self.per_token * x.numel()
        return x


class _FakeTower:
    """A tower whose passes advance a fake clock: ``fixed`` seconds per batch outside the layers
    (tokenising, embeddings, pooling) + ``per_layer`` seconds per token inside each layer."""

    def __init__(self, clock: _Clock, layers: int, fixed: float, per_layer: float) -> None:
        self.clock, self.fixed = clock, fixed
        self.backbone = torch.nn.Module()
        self.backbone.layers = torch.nn.ModuleList(_Layer(clock, per_layer) for _ in range(layers))

    def tokenize_documents(self, docs, max_length=None):
        return {"attention_mask": torch.ones(len(docs), 10, dtype=torch.long)}

    def pooled(self, enc):
        self.clock.t += self.fixed
        x = enc["attention_mask"].float()
        for layer in self.backbone.layers:
            x = layer(x)


def _calibrate(monkeypatch, per_layer_us: float, fixed: float = 0.05, docs: int = 64, layers: int = 3):
    clock = _Clock()
    monkeypatch.setattr(C.time, "perf_counter", clock)
    tower = _FakeTower(clock, layers, fixed, per_layer_us * 1e-6)
    corpus = [Document(f"d{i}", content="x" * (i + 1)) for i in range(docs)]
    return C.calibrate(QuickstartConfig(out="unused"), "llm", tower, corpus), tower


def test_the_layers_are_timed_apart_from_what_every_pass_pays(monkeypatch):
    ref = C.CAL_REF_US["llm"]
    rec, tower = _calibrate(monkeypatch, per_layer_us=1.5 * ref, fixed=0.2)  # a large fixed part is left out
    assert abs(rec["speed"] - 1.5) < 1e-6 and abs(rec["layer_token_us"] - 1.5 * ref) < 0.01
    assert rec["tokens"] == 64 * 10 and rec["layers"] == 3
    assert all(
        not layer._forward_hooks and not layer._forward_pre_hooks for layer in tower.backbone.layers
    )  # hooks removed
    one, _ = _calibrate(monkeypatch, per_layer_us=2.5 * ref, layers=1)  # one layer is timed the same way
    assert abs(one["speed"] - 2.5) < 1e-6
    fast, _ = _calibrate(monkeypatch, per_layer_us=0.5 * ref)
    assert fast["speed"] == 1.0 and fast["ratio"] < 1  # never below the model (a short plan breaks the budget)
    slow, _ = _calibrate(monkeypatch, per_layer_us=10 * ref)
    assert slow["speed"] == C.SPEED_RANGE[1]
    tiny, _ = _calibrate(monkeypatch, per_layer_us=1.0, fixed=0.0)  # 1 us a layer: a tiny test model
    assert tiny["speed"] == 1.0 and "too short" in tiny["note"]


def test_no_documents_or_an_unknown_family_are_priced_at_the_model(monkeypatch):
    rec, _ = _calibrate(monkeypatch, per_layer_us=100.0, docs=0)
    assert rec["speed"] == 1.0
    clock = _Clock()
    monkeypatch.setattr(C.time, "perf_counter", clock)
    tower = _FakeTower(clock, 3, 0.1, 1e-4)
    assert C.calibrate(QuickstartConfig(out="unused"), "other", tower, [Document("d", content="x")])["speed"] == 1.0
    tower.backbone = torch.nn.Module()  # no transformer blocks to be found: priced at the model, no error
    rec = C.calibrate(QuickstartConfig(out="unused"), "llm", tower, [Document("d", content="x")])
    assert rec["speed"] == 1.0 and "cannot time its layers" in rec["note"]


def _kuake_like(speed: float) -> tuple[QuickstartConfig, list, Sizes]:
    cfg = QuickstartConfig(out="unused", budget_minutes=15, families=["llm"])
    sizes = Sizes(
        docs=32_000, doc_tokens=94, train_examples=13_000, train_queries=4500, val_queries=500, speed_by={"llm": speed}
    )
    return cfg, [family(cfg, "llm")], sizes


def test_a_slow_machine_draws_a_smaller_proxy_and_the_plan_says_when_it_is_over():
    cfg, fams, at_model = _kuake_like(1.0)
    _, _, slow = _kuake_like(1.5)
    c1, p1 = sized_proxy(cfg, fams, at_model, {})
    c2, p2 = sized_proxy(cfg, fams, slow, {})
    assert p2.family_speed == {"llm": 1.5} and "llm 1.50x" in p2.text()
    # every phase of the family is priced at the measured speed
    assert p2.phases["stage1_large_towers"] > 1.3 * p1.phases["stage1_large_towers"]
    # the proxy gets what the rest of the plan leaves (less than its 30% share), down to the smallest fraction
    assert c2.proxy_fraction < c1.proxy_fraction and p2.phases["proxy"] < p1.phases["proxy"]
    assert proxy_share_s(p2) < 0.3 * 15 * 60
    over = p2.total > p2.budget_s
    assert ("OVER the budget by" in p2.text()) == over


def test_the_proxy_skips_a_width_run_that_no_proxy_outcome_could_bring_back(monkeypatch):
    cfg, fams, sizes = _kuake_like(1.5)
    assert proxy_width_runs(cfg, fams, sizes, {}) == {
        "llm": False
    }  # even one candidate and a free proxy cannot hold it
    roomy = replace(cfg, budget_minutes=600)
    assert proxy_width_runs(roomy, fams, sizes, {}) == {"llm": True}
    assert proxy_width_runs(replace(roomy, full_dim=False), fams, sizes, {}) == {"llm": False}
    _, plan = sized_proxy(cfg, fams, sizes, {})
    assert plan.proxy_width == {"llm": False}
    with_width = make_plan(cfg, {f.name: f for f in fams}, sizes, ("llm", 1), proxy_width={"llm": True})
    assert plan.proxy_candidates(cfg, {f.name: f for f in fams}).width == {"llm": False}
    assert with_width.proxy_candidates(cfg, {f.name: f for f in fams}).width == {"llm": True}
    # compare_on_proxy honours it: no width run, and says why
    calls = []
    fake = {
        2: {"best_val_score": 0.8, "lr_scores": {1e-3: 0.8}, "depth": 2, "head_lr": 1e-3},
        4: {"best_val_score": 0.79, "lr_scores": {1e-3: 0.79}, "depth": 4, "head_lr": 1e-3},
    }
    monkeypatch.setattr(X.runs, "large_tower_runs", lambda *a, **k: fake)
    monkeypatch.setattr(X.runs, "full_dim_run", lambda *a, **k: calls.append(a) or {"best_val_score": 0.9, "dim": 576})
    cands, rec = X.compare_on_proxy(cfg, fams, {}, __import__("pathlib").Path("unused"), {"llm": False})
    assert calls == [] and cands.width == {"llm": False} and "cannot train it" in rec["reasons"]["llm width"]
    cands, _ = X.compare_on_proxy(cfg, fams, {}, __import__("pathlib").Path("unused"), {"llm": True})
    assert len(calls) == 1 and cands.width == {"llm": True}


def test_the_proxy_drawn_follows_the_data_and_seed_not_the_machine_speed(monkeypatch, capsys):
    """The first plan sizes the proxy (its fraction, its width runs) at the cost model's nominal speed:
    a machine twice as slow compares the same candidates on the same sample; only the plan's
    minutes (and the cuts after the proxy) follow the measured speed."""
    import scalingnote.quickstart.early as E

    seen = {}
    for speed in (1.0, 2.0):
        cfg, fams, sizes = _kuake_like(speed)
        monkeypatch.setattr(E.budget, "measure_sizes", lambda *a, _s=sizes, **k: _s)
        c, _, plan = E.first_plan(cfg, fams, {}, {"data": 5.0})
        seen[speed] = (c.proxy_fraction, plan.proxy_width, plan.proxy, plan.phases["stage1_large_towers"])
    assert seen[1.0][:3] == seen[2.0][:3]
    assert seen[1.0][0] < QuickstartConfig(out="unused").proxy_fraction  # the budget still sized it down (nominally)
    assert seen[2.0][3] > 1.5 * seen[1.0][3]  # the plan itself is priced at the measured speed


def test_the_proxy_never_drops_the_head_learning_rate_its_rule_chose(monkeypatch, tmp_path):
    """A default kept because the evidence did not separate the rates stays a survivor (its towers are
    not pruned) even when its proxy score is more than the margin below the best rate's."""
    cfg, fams, _ = _kuake_like(1.0)
    fake = {
        2: {
            "best_val_score": 0.70,
            "lr_scores": {1e-3: 0.70, 3e-3: 0.75},
            "depth": 2,
            "head_lr": 1e-3,
            "lr_choice": "not separated",
        },
        4: {"best_val_score": 0.60, "lr_scores": {1e-3: 0.60, 3e-3: 0.61}, "depth": 4, "head_lr": 1e-3},
    }
    monkeypatch.setattr(X.runs, "large_tower_runs", lambda *a, **k: fake)
    monkeypatch.setattr(X.runs, "full_dim_run", lambda *a, **k: None)
    for lr in ("0.001", "0.003"):  # what the proxy trained
        (tmp_path / "proxy" / "stage1" / f"llm_large_L4_hlr{lr}" / "query_tower").mkdir(parents=True)
    cands, rec = X.compare_on_proxy(cfg, fams, {}, tmp_path, {"llm": False})
    assert (
        sorted(cands.depths["llm"][2]) == [1e-3, 3e-3]
        and "0.001 kept: not separated" in rec["reasons"]["llm depth 2 head lrs"]
    )
    assert cands.depths["llm"][2][0] == 1e-3  # the rule's choice first: a budget that trains one rate trains it
    assert 4 not in cands.depths["llm"]  # more than the margin below depth 2: dropped, and its towers pruned
    assert not (tmp_path / "proxy" / "stage1" / "llm_large_L4_hlr0.001" / "query_tower").exists()
    assert (tmp_path / "proxy" / "stage1" / "llm_large_L4_hlr0.001").is_dir()
