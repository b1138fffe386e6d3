"""Fuzzing the running HTTP service, shared by ``tests/serve/test_serve_fuzz.py`` and
``benchmarks/fuzz.py``: schemathesis over every operation of its OpenAPI document
(:func:`fuzz_service`), and invalid Unicode and malformed bodies (:func:`fuzz_unicode`).
The input readers' fuzzing is in :mod:`tests.helpers.fuzz`."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st


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


# ------------------------------------------------------------------ the HTTP service (OpenAPI-driven)


def _operation_test(r: ServiceFuzzResult, strategy, *, base, session, headers, timeout_s, examples, seed):
    """A hypothesis test calling the service once per generated case of one operation, counted into ``r``."""
    import requests
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hseed

    @hseed(seed)
    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(case=strategy)
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
                r.first_failure = (
                    f"status {code} for body {case.body!r:.300} query {case.query!r:.100} headers {case.headers!r:.100}"
                )

    return run


def fuzz_service(
    url: str, openapi: dict, *, examples: int, admin_token: str | None = None, seed: int = 0, timeout_s: float = 20.0
) -> list[ServiceFuzzResult]:
    """Schemathesis over every operation of ``openapi`` against the running service at
    ``url`` (loopback only), with schema-valid (positive) and schema-violating (negative)
    inputs. A failure is a 5xx, a timeout (hang) or a connection error. Admin calls carry
    ``admin_token`` so the fuzzer reaches past the token check."""
    import requests
    import schemathesis
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
            run = _operation_test(
                r,
                op.as_strategy(generation_mode=mode),
                base=base,
                session=session,
                headers=headers,
                timeout_s=timeout_s,
                examples=examples,
                seed=seed,
            )
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


# ------------------------------------------------------------------ invalid Unicode / malformed bodies

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


def _unicode_test(r: ServiceFuzzResult, strategy, expected: set[int], *, base, session, timeout_s, examples, seed):
    """A hypothesis test posting each generated body to the service, counted into ``r``."""
    import requests
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hseed

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
                t in resp.text for t in ("Traceback", "TypeError", "UnicodeEncodeError", "RecursionError", "ValueError")
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

    return run


def fuzz_unicode(url: str, *, examples: int, seed: int = 0, timeout_s: float = 20.0) -> list[ServiceFuzzResult]:
    """The strategies of :data:`UNICODE_STRATEGIES` against the running service at ``url``
    (loopback only). A failure is a 5xx, a timeout or connection error, a status outside the
    strategy's expected set, an error body without ``error`` / ``detail``, or a body that
    echoes exception internals (a Python exception type name)."""
    import requests

    from benchmarks.loadgen import check_loopback_url

    base, _ = check_loopback_url(url)
    session = requests.Session()
    session.trust_env = False
    out: list[ServiceFuzzResult] = []
    for name, (strategy, expected) in UNICODE_STRATEGIES.items():
        r = ServiceFuzzResult(name, "invalid_unicode", statuses={})
        run = _unicode_test(
            r, strategy, expected, base=base, session=session, timeout_s=timeout_s, examples=examples, seed=seed
        )
        t0 = time.perf_counter()
        run()
        r.seconds = round(time.perf_counter() - t0, 2)
        out.append(r)
    session.close()
    return out
