#!/usr/bin/env bash
# README command 2 (and CI): set up the environment if needed, run the code checks (scripts/check.sh:
# ruff, ruff format, mypy), then the default test suite. Extra arguments go to pytest, e.g.
# `bash scripts/test.sh -m slow`; SCALINGNOTE_SKIP_CHECKS=1 runs the tests only.
# Exit status: non-zero if the checks or the tests failed (the tests run either way).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
cd "$root"
checks=0
[ "${SCALINGNOTE_SKIP_CHECKS:-0}" = "1" ] || bash "$root/scripts/check.sh" || checks=$?
tests=0
"${SCALINGNOTE_VENV:-$root/.venv}/bin/python" -m pytest "$@" || tests=$?
[ "$tests" -ne 0 ] && exit "$tests"
exit "$checks"
