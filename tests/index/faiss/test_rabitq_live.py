"""The live index's rules over ``ivf_rabitq``: the same add / delete / compact / rebuild scenario every
routed method passes (:mod:`tests.live.test_live_methods`), on an index chosen and built as the
quick start does. Tiny random BERT, real FAISS."""

from __future__ import annotations

import pytest

from tests.live import test_live_methods as scenario


@pytest.mark.parametrize("routed", ["ivf_rabitq"], indirect=True)
def test_add_delete_compact_rebuild_keep_ivf_rabitq(routed, tiny_bert_dir, tmp_path):
    scenario.test_add_delete_compact_rebuild_keep_the_method(routed, tiny_bert_dir, tmp_path)
