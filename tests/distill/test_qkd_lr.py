"""The quick start's QKD learning rate: what it passes to QKD and how a bad value is refused."""

from __future__ import annotations

import pytest

from scalingnote.errors import ConfigError
from tests.distill.test_qkd_bucketing import quick_start_qkd_config


def test_the_quick_start_passes_its_qkd_learning_rate(stage1, tmp_path, monkeypatch):
    from scalingnote.quickstart import QuickstartConfig

    for qkd_lr, want in ((None, 1e-3), (5e-4, 5e-4)):
        assert quick_start_qkd_config(stage1, tmp_path, monkeypatch, qkd_lr=qkd_lr).optim.lr == want
    # an LLM student keeps its own smaller rate unless one is given
    assert QuickstartConfig().qkd_lr_for("llm") == 1e-4
    assert QuickstartConfig(qkd_lr=2e-4).qkd_lr_for("llm") == 2e-4


@pytest.mark.parametrize("bad", [0, -1e-3, True])
def test_a_bad_qkd_learning_rate_names_its_field(bad):
    from scalingnote.quickstart import QuickstartConfig

    with pytest.raises(ConfigError, match="qkd_lr"):
        QuickstartConfig(qkd_lr=bad)
