#!/usr/bin/env bash
# The code checks (run by scripts/test.sh before the tests, so by CI too; .pre-commit-config.yaml runs
# the same tools on each commit for those who use pre-commit): the linter, the formatter (check only)
# and the type checker, configured in pyproject.toml; docs/contributing.md says why each rule is set.
# Fix what the first two report with `ruff check --fix` and `ruff format`.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bin="${SCALINGNOTE_VENV:-$root/.venv}/bin"
rc=0
echo "[check] ruff check" >&2
"$bin/ruff" check --no-fix src benchmarks tests scripts docs || rc=1
echo "[check] ruff format --check" >&2
"$bin/ruff" format --check src benchmarks tests scripts docs || rc=1
echo "[check] mypy (src/scalingnote)" >&2
"$bin/mypy" || rc=1
[ "$rc" -eq 0 ] && echo "[check] all clean" >&2 || echo "[check] FAILED: see the findings above" >&2
exit "$rc"
