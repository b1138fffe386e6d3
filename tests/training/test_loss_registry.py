"""The Stage I loss table: ``loss.name`` chooses the loss, the paper's Eq. 12 stays the default."""

from __future__ import annotations

import doctest
import importlib

import pytest
import torch
import torch.nn.functional as F

from scalingnote.config import load_config
from scalingnote.errors import ConfigError
from scalingnote.training import TrainConfig
from scalingnote.training.config import LossSpec
from scalingnote.training.losses import (
    LOSSES,
    LossBatch,
    get_loss,
    register_loss,
    scalingnote_loss,
    scalingnote_stage1_loss,
)
from scalingnote.training.losses.infonce import infonce_loss
from scalingnote.utils.registry import RegistryError


def _batch(b=6, h=16, seed=0, neg=True):
    g = torch.Generator().manual_seed(seed)
    r = lambda: torch.randn(b, h, generator=g)  # noqa: E731
    return LossBatch(r(), {"title": r(), "emb": r()}, {"title": r(), "emb": r()} if neg else None)


def test_default_is_the_paper_loss_with_the_config_hyper_parameters():
    spec = LossSpec(dims=[8, 16], alpha=0.3, margin=0.1)
    assert spec.name is None and spec.loss_name == "scalingnote"
    b = _batch()
    loss, comps = get_loss(spec.loss_name)(b, spec)
    ref, _ = scalingnote_loss(b.q, b.pos, b.neg, dims=[8, 16], alpha=0.3, margin=0.1)
    assert torch.equal(loss, ref) and comps["loss"] == pytest.approx(float(ref))


def test_infonce_is_eq5_at_full_dimension_on_one_view():
    b = _batch(neg=True)
    loss, _ = infonce_loss(b, tau=0.1)
    q, d, n = (F.normalize(x, dim=-1) for x in (b.q, b.pos["emb"], b.neg["emb"]))
    logits = q @ torch.cat([d, n]).T / 0.1
    expect = -(logits.log_softmax(-1).diagonal()).mean()
    torch.testing.assert_close(loss, expect)
    no_hard, _ = infonce_loss(b, tau=0.1, hard_negatives=False)
    torch.testing.assert_close(no_hard, -((q @ d.T / 0.1).log_softmax(-1).diagonal()).mean())
    with pytest.raises(ValueError, match="views"):
        infonce_loss(b, view="content")


def test_yaml_names_a_loss_by_shorthand_name_or_dotted_path(tmp_path):
    base = (
        "method: twinbert\noutput_dir: o\nquery_tower: {model: m}\ndoc_tower: {model: m}\ndim: 128\n"
        "data: {data_dir: d}\n"
    )
    f = tmp_path / "c.yaml"
    f.write_text(base + "loss: infonce\n")
    assert load_config(TrainConfig, f).loss.name == "infonce"
    f.write_text(base + "loss: {name: infonce, options: {view: emb}}\n")
    assert load_config(TrainConfig, f).loss.options == {"view": "emb"}
    f.write_text(base + "loss:\n  name: scalingnote.training.losses.infonce:infonce_loss\n")
    assert load_config(TrainConfig, f).loss.name.endswith(":infonce_loss")
    f.write_text(base + "loss:\n  name: cosent\n")
    with pytest.raises(ConfigError, match=r"line 8.*loss\.name.*unknown loss 'cosent'; known: .*\binfonce\b") as e:
        load_config(TrainConfig, f)
    assert e.value.field == "loss.name"
    assert all(name in str(e.value) for name in LOSSES.names())  # the message lists the table


def test_a_registered_loss_is_chosen_by_name_and_gone_after_the_scope(tmp_path):
    name = "test_loss_registry_margin"

    def margin(batch, spec):
        q, d = F.normalize(batch.q, dim=-1), F.normalize(batch.pos["emb"], dim=-1)
        loss = F.relu(spec.options["margin"] - (q * d).sum(-1)).mean()
        return loss, {"loss": float(loss)}

    with LOSSES.scoped():
        register_loss(name, margin)
        spec = LossSpec(name=name, options={"margin": 2.0})
        assert name in LOSSES.names() and get_loss(spec.loss_name) is margin
        b = _batch()
        loss, comps = get_loss(spec.loss_name)(b, spec)
        cos = (F.normalize(b.q, dim=-1) * F.normalize(b.pos["emb"], dim=-1)).sum(-1)
        torch.testing.assert_close(loss, (2.0 - cos).mean())
    assert name not in LOSSES
    with pytest.raises(ValueError, match=f"unknown loss '{name}'"):
        LossSpec(name=name)


@pytest.mark.parametrize(
    "module", ["scalingnote.training.losses.scalingnote_loss", "scalingnote.training.losses.infonce"]
)
def test_loss_docstring_examples_run(module):
    result = doctest.testmod(importlib.import_module(module), raise_on_error=False)
    assert result.attempted > 0 and result.failed == 0, result


def test_register_loss_refuses_a_taken_name():
    with pytest.raises(RegistryError, match="already registered"):
        register_loss("scalingnote", lambda b, s: None)
    assert get_loss("scalingnote") is scalingnote_stage1_loss


def test_a_retired_key_reads_as_null_and_refuses_a_value(tmp_path):
    base = (
        "method: twinbert\noutput_dir: o\nquery_tower: {model: m}\ndoc_tower: {model: m}\ndim: 128\n"
        "data: {data_dir: d}\n"
    )
    f = tmp_path / "c.yaml"
    f.write_text(base + "deepspeed: null\n")  # written by older versions into every saved config.yaml
    assert not hasattr(load_config(TrainConfig, f), "deepspeed")
    f.write_text(base + "deepspeed: zero3.json\n")
    with pytest.raises(ConfigError, match=r"line 7.*deepspeed.*no longer supported.*distributed: fsdp"):
        load_config(TrainConfig, f)
