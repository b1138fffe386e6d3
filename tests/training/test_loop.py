"""The shared training loop (Stage I, QKD and the TMJ phases run on it): exact resume after a
Ctrl-C in any part of a step, metrics log without duplicated lines, early stopping with the
best weights restored."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from scalingnote.errors import ScalingNoteError
from scalingnote.training.loop import LoopSettings, TrainLoop, adamw, load_trained_state, param_groups, trained_state


class Toy(TrainLoop):
    """Noisy linear regression: every step draws from torch's RNG (like dropout), so a resume
    that restored the wrong RNG state would drift."""

    def __init__(self, out, total=12, interrupt_at=None, where="after", val=None, **kw):
        super().__init__(
            out, total, LoopSettings(max_grad_norm=1.0, log_every=1, save_every=4, show_progress=False, **kw)
        )
        torch.manual_seed(0)
        self.model = nn.Linear(4, 1)
        self.x = torch.randn(32, 4)
        self.y = self.x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
        self.interrupt_at, self.where, self.val = interrupt_at, where, val
        self.build_optimizer(param_groups([self.model], 0.05, 0.05, 0.0), warmup_ratio=0.1)

    def modules(self):
        return [self.model]

    def train_step(self, step):
        if self.where == "grad" and step == self.interrupt_at:
            raise KeyboardInterrupt
        noise = 0.1 * torch.randn(32, 1)
        loss = ((self.model(self.x) + noise - self.y) ** 2).mean()
        loss.backward()
        return {"loss": float(loss.detach())}

    def after_step(self, step):
        if self.where == "after" and step == self.interrupt_at:
            raise KeyboardInterrupt

    def model_state(self):
        return {"model": self.model.state_dict()}

    def load_model_state(self, state):
        self.model.load_state_dict(state["model"])

    def validate(self):
        return None if self.val is None else self.val(self)


@pytest.mark.parametrize("where,at", [("after", 6), ("grad", 6), ("after", 4)])
def test_interrupt_anywhere_then_resume_is_exact(tmp_path, where, at):
    full = Toy(tmp_path / "full")
    full.run()
    killed = Toy(tmp_path / "killed", interrupt_at=at, where=where)
    with pytest.raises(KeyboardInterrupt):
        killed.run()
    torch.manual_seed(123)  # a new process: the RNG must come from the checkpoint
    again = Toy(tmp_path / "killed")
    again.run()
    for k, v in full.model.state_dict().items():
        torch.testing.assert_close(again.model.state_dict()[k], v, rtol=0, atol=0, msg=k)
    a = [json.loads(x) for x in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    b = [json.loads(x) for x in (tmp_path / "killed" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in b] == list(range(1, 13))  # no line lost or duplicated
    assert [r["loss"] for r in a] == [r["loss"] for r in b]


def test_early_stopping_restores_the_best_weights(tmp_path):
    scores = iter([0.1, 0.5, 0.4, 0.3, 0.2, 0.1])
    snap = {}

    def val(loop):
        s = next(scores)
        snap[loop.step] = {k: v.clone() for k, v in loop.model.state_dict().items()}
        return s

    t = Toy(tmp_path / "es", total=40, val=val, eval_every=2, patience=3)
    res = t.run()
    assert res["best_step"] == 2 and res["stopped_early"] == 1.0 and res["steps_run"] == 8
    assert [c[0] for c in t.best["curve"]] == [0, 2, 4, 6, 8]
    for k, v in snap[2].items():
        torch.testing.assert_close(t.model.state_dict()[k], v, rtol=0, atol=0)


def test_a_changed_schedule_refuses_the_old_checkpoint(tmp_path):
    t = Toy(tmp_path / "a", interrupt_at=5)
    with pytest.raises(KeyboardInterrupt):
        t.run()
    with pytest.raises(ScalingNoteError, match="total steps"):
        Toy(tmp_path / "a", total=20).run()


@pytest.mark.parametrize("schedule", ["linear", "constant"])
def test_learning_rate_schedules(schedule):
    from scalingnote.training.loop import linear_warmup_decay

    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = linear_warmup_decay(opt, 100, 0.1, schedule=schedule, warmup_steps=4)
    lrs = []
    for _ in range(100):
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    assert lrs[0] == 0.0 and lrs[2] == pytest.approx(0.5) and lrs[4] == pytest.approx(1.0)  # warm-up of 4 steps, not 10
    if schedule == "constant":
        assert lrs[-1] == pytest.approx(1.0)  # a longer run does not end at a lower rate
    else:
        assert lrs[-1] == pytest.approx(1 / 96) and lrs[50] < lrs[10]


def test_an_unknown_schedule_is_refused():
    from scalingnote.training.loop import linear_warmup_decay

    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ScalingNoteError, match="schedule"):
        linear_warmup_decay(opt, 10, 0.1, schedule="cosine")


def test_adamw_uses_the_fused_kernel_where_it_can_and_matches_the_default():
    torch.manual_seed(0)
    a, b = nn.Linear(6, 3), nn.Linear(6, 3)
    b.load_state_dict(a.state_dict())
    fused, plain = adamw(param_groups([a], 0.1, 0.1, 0.01)), torch.optim.AdamW(param_groups([b], 0.1, 0.1, 0.01))
    assert fused.defaults["fused"] and not plain.defaults.get("fused")
    x = torch.randn(16, 6)
    for _ in range(5):
        for m, opt in ((a, fused), (b, plain)):
            opt.zero_grad()
            m(x).pow(2).sum().backward()
            opt.step()
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_trained_state_leaves_out_frozen_weights_and_loading_checks_the_rest():
    m = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), nn.Linear(4, 2))
    m.register_buffer("center", torch.ones(4))
    m[0].requires_grad_(False)
    st = trained_state(m)
    assert set(st) == {"1.weight", "1.bias", "2.weight", "2.bias", "center"}
    fresh = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), nn.Linear(4, 2))
    fresh.register_buffer("center", torch.zeros(4))
    fresh[0].requires_grad_(False)
    load_trained_state(fresh, st, "here")
    torch.testing.assert_close(fresh.center, torch.ones(4))
    torch.testing.assert_close(fresh[2].weight, m[2].weight)
    with pytest.raises(ScalingNoteError, match="here: checkpoint does not match"):
        load_trained_state(fresh, {k: v for k, v in st.items() if k != "2.bias"}, "here")
