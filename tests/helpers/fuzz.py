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
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from scalingnote.errors import DataError

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
        except Exception as e:  # noqa: BLE001 - the bug this fuzzer looks for
            raise FuzzFailure(f"{target.name}: {type(e).__name__}: {e} (input {data[:200]!r})") from e
    return "ok"


# ------------------------------------------------------------------ the HTTP service (OpenAPI-driven)


@dataclass
class ServiceFuzzResult:
    operation: str
    mode: str
    examples: int = 0
    failures: int = 0
    statuses: dict[int, int] | None = None
    first_failure: str | None = None
    note: str | None = None
    seconds: float = 0.0


def fuzz_service(
    url: str, openapi: dict, *, examples: int, admin_token: str | None = None, seed: int = 0, timeout_s: float = 20.0
) -> list[ServiceFuzzResult]:
    """Schemathesis over every operation of ``openapi`` against the running service at
    ``url`` (loopback only), with schema-valid (positive) and schema-violating (negative)
    inputs. A failure is a 5xx, a timeout (hang) or a connection error. Admin calls carry
    ``admin_token`` so the fuzzer reaches past the token check."""
    import requests
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hseed
    from hypothesis.errors import Unsatisfiable
    from schemathesis import GenerationMode

    from benchmarks.loadgen import check_loopback_url

    base, _ = check_loopback_url(url)
    schema = schemathesis.openapi.from_dict(openapi)
    session = requests.Session()
    session.trust_env = False
    headers = {"Authorization": f"Bearer {admin_token}"} if admin_token else {}
    out: list[ServiceFuzzResult] = []
    for res in schema.get_all_operations():
        op = res.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            r = ServiceFuzzResult(f"{op.method.upper()} {op.path}", mode.value, statuses={})

            @hseed(seed)
            @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
            @given(case=op.as_strategy(generation_mode=mode))
            def run(case) -> None:
                r.examples += 1
                try:
                    resp = case.call(base_url=base, session=session, headers=headers, timeout=timeout_s)
                    code = resp.status_code
                except requests.Timeout:
                    code = -1
                except requests.RequestException as e:
                    code = -2
                    r.first_failure = r.first_failure or f"{type(e).__name__}: {e}"
                r.statuses[code] = r.statuses.get(code, 0) + 1
                if code >= 500 or code < 0:
                    r.failures += 1
                    if r.first_failure is None:
                        r.first_failure = f"status {code} for body {case.body!r:.300} query {case.query!r:.100} headers {case.headers!r:.100}"

            t0 = time.perf_counter()
            try:
                run()
            except Unsatisfiable:  # e.g. a GET without parameters has no schema-violating input
                r.note = "no schema-violating input exists for this operation"
            r.seconds = round(time.perf_counter() - t0, 2)
            if r.examples or r.note is None:
                out.append(r)
    session.close()
    return out


# ------------------------------------------------------------------ invalid Unicode / malformed bodies (issue 32)

_SURROGATES = st.integers(min_value=0xD800, max_value=0xDFFF).map(chr)
_BLANK_CHARS = "\x00\x01\x1f\x7f\t\n \u00a0\u200b\u200c\u200d\u2028\u2029\u2060\ufeff\u202e\u180e"
_good_text = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc", "Cf", "Zs", "Zl", "Zp")),
    min_size=1,
    max_size=20,
)


def _splice_at(body: bytes, junk: bytes, at: int) -> bytes:
    at = at % (len(body) + 1)
    return body[:at] + junk + body[at:]


def _with_surrogate(draw_text: str, s: str, at: int) -> str:
    at = at % (len(draw_text) + 1)
    return draw_text[:at] + s + draw_text[at:]


#: (name, strategy of (path, body bytes, content type), statuses the service must answer with)
UNICODE_STRATEGIES: dict[str, tuple[Any, set[int]]] = {
    # valid JSON (\\udXXX escapes), invalid Unicode: 422 naming the field, before batching
    "lone_surrogate_query": (
        st.builds(
            lambda t, s, i: ("/search", json.dumps({"query": _with_surrogate(t, s, i)}).encode(), "application/json"),
            st.text(max_size=20),
            _SURROGATES,
            st.integers(0, 40),
        ),
        {422},
    ),
    "lone_surrogate_in_batch": (
        st.builds(
            lambda good, t, s, i, pos: (
                "/search/batch",
                json.dumps({"queries": good[:pos] + [_with_surrogate(t, s, i)] + good[pos:]}).encode(),
                "application/json",
            ),
            st.lists(_good_text, min_size=0, max_size=4),
            st.text(max_size=10),
            _SURROGATES,
            st.integers(0, 20),
            st.integers(0, 4),
        ),
        {422},
    ),
    # only NUL / control / zero-width / format / separator characters: an empty query
    "blank_query": (
        st.builds(
            lambda t: ("/search", json.dumps({"query": t}).encode(), "application/json"),
            st.text(alphabet=_BLANK_CHARS, min_size=1, max_size=20),
        ),
        {422},
    ),
    # a surrogate in a field name (echoed in the 422's field list)
    "surrogate_field_name": (
        st.builds(
            lambda s, t: ("/search", json.dumps({"query": "fox", s + t: 1}).encode(), "application/json"),
            _SURROGATES,
            st.text(max_size=5),
        ),
        {422},
    ),
    # invalid UTF-8 spliced into a valid body: malformed_json (400)
    "invalid_utf8_body": (
        st.builds(
            lambda t, junk, i: (
                "/search",
                _splice_at(json.dumps({"query": t}, ensure_ascii=False).encode(), junk, i),
                "application/json",
            ),
            st.text(max_size=20),
            st.sampled_from([b"\xff", b"\xfe\xff", b"\xc3", b"\xe2\x82", b"\xc0\xaf", b"\xf8\x88\x80\x80\x80"]),
            st.integers(0, 60),
        ),
        {400},
    ),
    # a surrogate encoded as UTF-8 bytes (CESU-8, invalid UTF-8): Python's JSON decoder reads it
    # as a lone surrogate ("surrogatepass"), so inside the query string it is a 422 naming the
    # field, elsewhere a 400 malformed_json
    "encoded_surrogate_body": (
        st.builds(
            lambda t, junk, i: (
                "/search",
                _splice_at(json.dumps({"query": t}, ensure_ascii=False).encode(), junk, i),
                "application/json",
            ),
            st.text(max_size=20),
            st.sampled_from([b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xed\xb2\x80"]),
            st.integers(0, 60),
        ),
        {400, 422},
    ),
    # nested deeper than the JSON parser allows: malformed_json (400); shallower: 422 (wrong type)
    "deep_json": (
        st.builds(
            lambda n, obj: (
                "/search",
                (b'{"query": ' if obj else b"") + b"[" * n + b"]" * n + (b"}" if obj else b""),
                "application/json",
            ),
            st.sampled_from([10, 500, 5_000, 50_000, 200_000]),
            st.booleans(),
        ),
        {400, 422},
    ),
    # a body that is not JSON by its content type: 415
    "wrong_content_type": (
        st.builds(
            lambda ct: ("/search", b'{"query": "fox"}', ct),
            st.sampled_from(
                [
                    "text/plain",
                    "text/json",
                    "application/xml",
                    "application/x-www-form-urlencoded",
                    "multipart/form-data; boundary=x",
                    "application/octet-stream",
                    "image/png",
                ]
            ),
        ),
        {415},
    ),
}


def fuzz_unicode(url: str, *, examples: int, seed: int = 0, timeout_s: float = 20.0) -> list[ServiceFuzzResult]:
    """The strategies of :data:`UNICODE_STRATEGIES` against the running service at ``url``
    (loopback only). A failure is a 5xx, a timeout or connection error, a status outside the
    strategy's expected set, an error body without ``error`` / ``detail``, or a body that
    echoes exception internals (a Python exception type name)."""
    import requests
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hseed

    from benchmarks.loadgen import check_loopback_url

    base, _ = check_loopback_url(url)
    session = requests.Session()
    session.trust_env = False
    out: list[ServiceFuzzResult] = []
    for name, (strategy, expected) in UNICODE_STRATEGIES.items():
        r = ServiceFuzzResult(name, "invalid_unicode", statuses={})

        @hseed(seed)
        @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(case=strategy)
        def run(case) -> None:
            path, body, ctype = case
            r.examples += 1
            why = None
            try:
                resp = session.post(base + path, data=body, headers={"content-type": ctype}, timeout=timeout_s)
                code = resp.status_code
                payload = resp.json()
                if code not in expected:
                    why = f"status {code} (expected {sorted(expected)})"
                elif not (isinstance(payload, dict) and payload.get("error") and payload.get("detail")):
                    why = "error body without error/detail"
                elif any(
                    t in resp.text
                    for t in ("Traceback", "TypeError", "UnicodeEncodeError", "RecursionError", "ValueError")
                ):
                    why = "internals in the body"
            except requests.Timeout:
                code, why = -1, "timeout"
            except (requests.RequestException, ValueError) as e:
                code, why = -2, f"{type(e).__name__}: {e}"
            r.statuses[code] = r.statuses.get(code, 0) + 1
            if why is not None:
                r.failures += 1
                r.first_failure = r.first_failure or f"{why} for {path} {ctype} body {body[:200]!r}"

        t0 = time.perf_counter()
        run()
        r.seconds = round(time.perf_counter() - t0, 2)
        out.append(r)
    session.close()
    return out
