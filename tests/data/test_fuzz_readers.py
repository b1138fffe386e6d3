"""Property-based fuzzing of every reader (BEIR corpus / queries / qrels, TREC runs,
triplets, click / relevance logs as TSV and JSONL, YAML configs): any bytes either parse
or raise DataError / ConfigError naming the file and line — never another exception.

A few hundred examples per reader here (seconds); ``benchmarks/fuzz.py`` runs many more.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from tests.helpers.fuzz import TARGETS, check, inputs

FUZZ = settings(
    max_examples=100,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_reader_parses_or_names_file_and_line(name, tmp_path):
    target = TARGETS[name]

    @FUZZ
    @given(data=inputs(target.structured))
    def prop(data: bytes) -> None:
        check(target, data, tmp_path)

    prop()


@pytest.mark.parametrize(
    ("name", "data", "where"),
    [  # inputs the fuzzer found before the readers were fixed (regressions)
        ("trec_run", b"q1 Q0 d1 1 0.5 t\n\xff\xfe 0 d 1 1 t\n", "line 2"),
        ("beir_qrels", b"query-id\tcorpus-id\tscore\nq1\td1\t1\n\xc3(\td\t1\n", "line 3"),
        ("beir_qrels", b"q1\td1\tnan\n", "field 'score'"),
        ("beir_qrels", b"q1\td1\tinf\n", "field 'score'"),
        ("beir_qrels", b"q1\td1\t1e400\n", "field 'score'"),
        (
            "click_log_tsv",
            b"query_id\tdoc_id\tposition\tclicked\n" + b"q\td\t1\t1\n" * 3000 + b"q\td\t1\t\xff\n",
            "line 3002",
        ),
        ("yaml_train_config", b"seed: 2020-99-99\n", "line 1"),
        ("yaml_train_config", b"seed: 1\n\xff\n", "train.yaml"),
    ],
)
def test_fuzz_regressions(name, data, where, tmp_path):
    from scalingnote.errors import DataError

    target = TARGETS[name]
    assert check(target, data, tmp_path) == "data_error"
    p = tmp_path / target.filename
    p.write_bytes(data)
    with pytest.raises(DataError, match=where):
        target.read(p)
