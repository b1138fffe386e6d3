"""Fuzzing benchmark: property-based fuzzing of every reader and OpenAPI-driven fuzzing
(schemathesis) of the running service, with many more examples than the unit tests.

* readers (``tests/helpers/fuzz.py``: BEIR corpus / queries / qrels, TREC run, triplets,
  click / relevance logs as TSV and JSONL, four YAML configs): ``--reader-examples`` inputs
  each (raw bytes, hostile structured records, records with random bytes spliced in); a
  failure is any exception other than the project's DataError / ConfigError naming the
  file and line.
* service: a real ``uvicorn`` server on 127.0.0.1 (tiny BERT tower, IVF-PQ index over the
  tiny BEIR corpus), ``--endpoint-examples`` schema-valid and schema-violating requests per
  operation; a failure is a 5xx, a timeout (hang) or a connection error; afterwards
  ``/healthz`` must be 200 and a search must answer.
* invalid Unicode and malformed bodies (``tests/helpers/fuzz.py:
  UNICODE_STRATEGIES``): lone surrogates in a query, in a batch or in a field name, blank
  (NUL / zero-width / format-only) queries, invalid UTF-8 spliced into a body, deeply nested
  JSON, non-JSON content types; ``--endpoint-examples`` each; a failure is any status outside
  the documented one (422 / 400 ``malformed_json`` / 415), a 5xx, a hang, or internals in the body.

Writes ``benchmarks/results/fuzz.json`` (one row per reader / endpoint + mode).
Run: ``.venv/bin/python -m benchmarks.fuzz`` (a few minutes).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import json
import tempfile
import time
from pathlib import Path

from benchmarks._common import tiny_served_index, write_results


def _fuzz_reader(target, examples: int, seed: int, workdir: Path) -> dict:
    """Run one reader's property under hypothesis -> counts of examples, ok, data errors, failures."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hseed

    from tests.helpers.fuzz import FuzzFailure, check, inputs

    stats = {"examples": 0, "ok": 0, "data_error": 0, "failures": 0, "first_failure": ""}

    @hseed(seed)
    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(data=inputs(target.structured))
    def prop(data: bytes) -> None:
        stats["examples"] += 1
        try:
            stats[check(target, data, workdir)] += 1
        except FuzzFailure as e:
            stats["failures"] += 1
            stats["first_failure"] = stats["first_failure"] or str(e)[:300]

    prop()
    return stats


def fuzz_readers(examples: int, seed: int) -> list[dict]:
    from tests.helpers.fuzz import TARGETS

    rows = []
    with tempfile.TemporaryDirectory(prefix="sn-fuzz-") as d:
        for name, target in TARGETS.items():
            t0 = time.perf_counter()
            stats = _fuzz_reader(target, examples, seed, Path(d))
            row = {
                "kind": "reader",
                "target": name,
                "mode": "bytes+structured",
                **stats,
                "seconds": round(time.perf_counter() - t0, 2),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def fuzz_endpoints(examples: int, seed: int) -> tuple[list[dict], dict]:
    import httpx

    from scalingnote.serve import BackgroundServer, ServeSettings, create_app
    from tests.helpers.fuzz import fuzz_service, fuzz_unicode

    rows = []
    with tempfile.TemporaryDirectory(prefix="sn-fuzz-svc-") as d:
        root = Path(d)
        bert, beir, idx = tiny_served_index(root)
        settings = ServeSettings(port=0, max_wait_ms=1)
        app = create_app(idx, bert, settings)
        with BackgroundServer(app) as srv:
            srv.wait_ready()
            for r in fuzz_service(
                srv.url, app.openapi(), examples=examples, admin_token=app.state.admin_token, seed=seed
            ):
                row = {
                    "kind": "endpoint",
                    "target": r.operation,
                    "mode": r.mode,
                    "examples": r.examples,
                    "ok": r.statuses.get(200, 0),
                    "data_error": sum(v for k, v in r.statuses.items() if 400 <= k < 500),
                    "failures": r.failures,
                    "first_failure": r.first_failure or "",
                    "seconds": r.seconds,
                    "statuses": " ".join(f"{k}:{v}" for k, v in sorted(r.statuses.items())),
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
            for r in fuzz_unicode(srv.url, examples=examples, seed=seed):  # invalid Unicode, malformed bodies
                row = {
                    "kind": "endpoint",
                    "target": f"POST {r.operation}",
                    "mode": r.mode,
                    "examples": r.examples,
                    "ok": r.statuses.get(200, 0),
                    "data_error": sum(v for k, v in r.statuses.items() if 400 <= k < 500),
                    "failures": r.failures,
                    "first_failure": r.first_failure or "",
                    "seconds": r.seconds,
                    "statuses": " ".join(f"{k}:{v}" for k, v in sorted(r.statuses.items())),
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
            h = httpx.get(srv.url + "/healthz", trust_env=False, timeout=30)
            s = httpx.post(
                srv.url + "/search", json={"query": "product quantization", "k": 3}, trust_env=False, timeout=30
            )
            after = {"healthz_status": h.status_code, "healthz": h.json().get("status"), "search_status": s.status_code}
    return rows, after


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reader-examples", type=int, default=500)
    ap.add_argument("--endpoint-examples", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    rows = fuzz_readers(args.reader_examples, args.seed)
    _write(rows, args, None, t0)  # the reader results survive an interrupted endpoint phase
    erows, after = fuzz_endpoints(args.endpoint_examples, args.seed)
    rows += erows
    path = _write(rows, args, after, t0)
    print(f"wrote {path}", flush=True)


def _write(rows: list[dict], args, after: dict | None, t0: float):
    import hypothesis
    import schemathesis

    config = {
        "reader_examples": args.reader_examples,
        "endpoint_examples": args.endpoint_examples,
        "seed": args.seed,
        "hypothesis": hypothesis.__version__,
        "schemathesis": schemathesis.SCHEMATHESIS_VERSION,
        "service_after_fuzzing": after,
        "failures_total": sum(r["failures"] for r in rows),
        "examples_total": sum(r["examples"] for r in rows),
        "wall_s": round(time.perf_counter() - t0, 1),
        "property": "readers: parse or raise DataError/ConfigError naming the file (and line for record errors); "
        "service: no 5xx, no timeout/connection error, healthy afterwards",
        "note": "2 CPU cores shared with other jobs (the machine was shared); seconds are noisy.",
        "complete": after is not None,
    }
    return write_results("fuzz", rows, config)


if __name__ == "__main__":
    main()
