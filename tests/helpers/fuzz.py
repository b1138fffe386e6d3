"""Property-based fuzzing of every input reader (hypothesis), shared by
``tests/data/test_fuzz_readers.py`` (a few hundred examples per reader) and
``benchmarks/fuzz.py`` (many more, counted into ``benchmarks/results/fuzz.json``).

The property: for ANY bytes written to the reader's file, the reader either returns or
raises :class:`scalingnote.errors.DataError` (``ConfigError`` for YAML) that names the file
and, for a record-level problem, the line. Any other exception is a bug.

Inputs mix three generators so the fuzzer gets past the first line: raw bytes, lines
built from the reader's own fields with hostile values (wrong types, NaN, huge numbers,
control characters, duplicates), and such lines with random bytes spliced in.
"""

from __future__ import annotations

import json
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from scalingnote.errors import DataError

# the service's fuzzing, importable from here as before
from tests.helpers.fuzz_service import UNICODE_STRATEGIES, ServiceFuzzResult, fuzz_service, fuzz_unicode

__all__ = [
    "TARGETS",
    "UNICODE_STRATEGIES",
    "FuzzFailure",
    "ServiceFuzzResult",
    "Target",
    "check",
    "fuzz_service",
    "fuzz_unicode",
    "inputs",
]

# ------------------------------------------------------------------ value strategies

_text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
_ids = st.one_of(st.sampled_from(["d1", "d2", "q1", "q2", " ", "", "0", "d1 ", "\t", "a\nb"]), _text)
_numbers = st.one_of(
    st.integers(min_value=-(10**20), max_value=10**20),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, 2, -1, 0.5, 1e308]),
)
_json_scalar = st.one_of(st.none(), st.booleans(), _numbers, _ids, _text)
_json_value = st.recursive(
    _json_scalar,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_text, inner, max_size=3)),
    max_leaves=6,
)
_cell = st.one_of(
    _ids,
    _numbers.map(str),
    st.sampled_from(["nan", "inf", "-inf", "1e999", "true", "false", "1.0", "01", " 1 ", "NaN"]),
)


def _json_lines(keys: list[str]) -> st.SearchStrategy[bytes]:
    """JSONL records over ``keys`` (each key present or not) with hostile values, plus junk lines."""
    record = st.fixed_dictionaries({}, optional={k: _json_value for k in keys}).flatmap(
        lambda d: st.dictionaries(_text, _json_value, max_size=2).map(lambda extra: {**d, **extra})
    )
    line = st.one_of(
        record.map(lambda r: json.dumps(r, ensure_ascii=False, allow_nan=True)),
        _json_value.map(lambda v: json.dumps(v, allow_nan=True)),  # not an object
        st.sampled_from(
            ["", "   ", "{", "{}", "[1]", '{"_id": "d1"', "null", '"\\ud800"', '{"_id": "\\udc00", "text": "x"}']
        ),
        _text,
    )
    return st.lists(line, max_size=8).map(lambda ls: "\n".join(ls).encode("utf-8", "surrogatepass"))


def _tsv_lines(header: list[str] | None, n_cols: int) -> st.SearchStrategy[bytes]:
    row = st.lists(_cell, min_size=max(0, n_cols - 2), max_size=n_cols + 2).map("\t".join)
    space_row = st.lists(_cell, min_size=n_cols, max_size=n_cols).map(" ".join)
    lines = st.lists(st.one_of(row, space_row, _text), max_size=8)
    heads = st.sampled_from([None, "\t".join(header)] if header else [None])
    return st.tuples(heads, lines, st.sampled_from(["\n", "\r\n", "\r"])).map(
        lambda t: t[2].join(([t[0]] if t[0] else []) + t[1]).encode("utf-8", "surrogatepass")
    )


def _yaml_docs(keys: list[str]) -> st.SearchStrategy[bytes]:
    import yaml

    mapping = st.fixed_dictionaries({}, optional={k: _json_value for k in keys})
    dumped = mapping.map(lambda d: yaml.safe_dump(d, allow_unicode=True))
    raw = st.sampled_from(
        [
            "a: [1, 2",
            "seed: 2020-99-99",
            "seed: 2001-02-29",
            "x: !!python/object:os.system {}",
            "- 1\n- 2",
            "&a [*a]",
            "? [1]\n: 2",
            "dim: 1e3",
            "seed: 0x1F",
            "seed: .inf",
            "key: value\n\tbad: tab",
            "%YAML 9.9\n---\na: 1",
            "a: *nope",
            "seed: 1_000",
            "optim: {lr: nan}",
            "data: 3",
            "loss: {dims: [1, 2, 3]}",
            "seed: 12:30:00",
        ]
    )
    return st.one_of(dumped, raw, st.tuples(dumped, raw).map(lambda t: t[0] + "\n" + t[1]), _text).map(
        lambda s: s.encode("utf-8", "surrogatepass")
    )


def _splice(base: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    """Insert random bytes (invalid UTF-8, NUL, BOM ...) at a random place of ``base``."""
    junk = st.one_of(
        st.binary(min_size=1, max_size=8),
        st.sampled_from([b"\xff", b"\xc3", b"\x00", b"\xef\xbb\xbf", b"\xed\xa0\x80", b"\r"]),
    )
    return st.tuples(base, junk, st.floats(0, 1)).map(
        lambda t: t[0][: int(len(t[0]) * t[2])] + t[1] + t[0][int(len(t[0]) * t[2]) :]
    )


def inputs(structured: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    return st.one_of(st.binary(max_size=300), structured, _splice(structured))


# ------------------------------------------------------------------ readers


def _config(cls_path: str) -> Callable[[Path], Any]:
    def load(p: Path) -> Any:
        import importlib

        mod, _, name = cls_path.rpartition(".")
        cls = getattr(importlib.import_module(mod), name)
        from scalingnote.config import load_config

        return load_config(cls, p)

    return load


def _build_config(p: Path) -> Any:
    from scalingnote.data.build import load_build_config

    return load_build_config(p)


def _reader(fn_path: str) -> Callable[[Path], Any]:
    def call(p: Path) -> Any:
        import importlib

        mod, _, name = fn_path.rpartition(".")
        return getattr(importlib.import_module(mod), name)(p)

    return call


@dataclass(frozen=True)
class Target:
    name: str
    filename: str
    read: Callable[[Path], Any]
    structured: st.SearchStrategy[bytes]
    #: errors about the file as a whole (e.g. an empty log) may lack a line number
    file_level_ok: bool = False


TARGETS: dict[str, Target] = {
    t.name: t
    for t in [
        Target(
            "beir_corpus",
            "corpus.jsonl",
            _reader("scalingnote.data.beir.load_corpus"),
            _json_lines(["_id", "id", "title", "text", "content", "topic"]),
        ),
        Target(
            "beir_queries",
            "queries.jsonl",
            _reader("scalingnote.data.beir.load_queries"),
            _json_lines(["_id", "id", "text"]),
        ),
        Target(
            "beir_qrels",
            "test.tsv",
            _reader("scalingnote.data.beir.load_qrels"),
            _tsv_lines(["query-id", "corpus-id", "score"], 3),
        ),
        Target(
            "trec_run",
            "run.trec",
            _reader("scalingnote.data.trec.read_run"),
            _tsv_lines(None, 6).map(lambda b: b.replace(b"\t", b" ")),
        ),
        Target(
            "triplets",
            "triplets.jsonl",
            _reader("scalingnote.data.triplets.load_triplets"),
            _json_lines(["query_id", "pos_id", "neg_id", "source"]),
        ),
        Target(
            "click_log_tsv",
            "clicks.tsv",
            _reader("scalingnote.data.logs.read_click_log"),
            _tsv_lines(["query_id", "doc_id", "position", "clicked"], 4),
        ),
        Target(
            "click_log_jsonl",
            "clicks.jsonl",
            _reader("scalingnote.data.logs.read_click_log"),
            _json_lines(["query_id", "qid", "doc_id", "position", "clicked"]),
        ),
        Target(
            "relevance_log_tsv",
            "relevance.tsv",
            _reader("scalingnote.data.logs.read_relevance_log"),
            _tsv_lines(["query_id", "doc_id", "score"], 3),
        ),
        Target(
            "relevance_log_jsonl",
            "relevance.jsonl",
            _reader("scalingnote.data.logs.read_relevance_log"),
            _json_lines(["query_id", "doc_id", "score", "pid"]),
        ),
        Target(
            "yaml_train_config",
            "train.yaml",
            _config("scalingnote.training.config.TrainConfig"),
            _yaml_docs(
                ["method", "dim", "seed", "optim", "loss", "data", "query_tower", "lora", "precision", "save_every"]
            ),
        ),
        Target(
            "yaml_distill_config",
            "qkd.yaml",
            _config("scalingnote.distill.config.DistillConfig"),
            _yaml_docs(["teacher", "student", "queries", "lam", "optim", "seed", "head_init", "output_dir"]),
        ),
        Target(
            "yaml_pq_config",
            "tmj.yaml",
            _config("scalingnote.pq.config.PQTrainConfig"),
            _yaml_docs(["data", "towers", "pq", "stage1", "tau", "seed", "threads", "output_dir"]),
        ),
        Target(
            "yaml_build_config",
            "build.yaml",
            _build_config,
            _yaml_docs(
                [
                    "queries",
                    "out",
                    "corpus",
                    "click_log",
                    "relevance_log",
                    "seed",
                    "validation_fraction",
                    "relevance",
                    "leakage",
                ]
            ),
        ),
    ]
}


class FuzzFailure(AssertionError):
    pass


def check(target: Target, data: bytes, workdir: Path | None = None) -> str:
    """Write ``data`` to the target's file and read it. Returns "ok" or "data_error";
    raises :class:`FuzzFailure` for any other exception or an error that names no file/line."""
    with tempfile.TemporaryDirectory(dir=workdir) as d:
        path = Path(d) / target.filename
        path.write_bytes(data)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                target.read(path)
        except DataError as e:
            if e.path is None or Path(e.path).name != target.filename:
                raise FuzzFailure(f"{target.name}: error does not name the file: {e!s} (input {data[:200]!r})") from e
            if e.line is None and e.field is None and not target.file_level_ok:
                raise FuzzFailure(
                    f"{target.name}: error names neither line nor field: {e!s} (input {data[:200]!r})"
                ) from e
            if not str(e).startswith(str(e.path)):
                raise FuzzFailure(f"{target.name}: message does not start with the file: {e!s}") from e
            return "data_error"
        except Exception as e:  # the bug this fuzzer looks for
            raise FuzzFailure(f"{target.name}: {type(e).__name__}: {e} (input {data[:200]!r})") from e
    return "ok"
