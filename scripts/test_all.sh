#!/usr/bin/env bash
# Everything, as CI runs it (.ci/run; the README's "Tests and CI"): set up the environment if needed, then run the
# default test suite (README command 2, `bash scripts/test.sh`) and after it the `slow` suite (the same command with `-m slow`) (FSDP2 on two gloo processes, DDP QKD, Ray
# Data on a local Ray instance, the embedded Milvus server, the packaged real models, ...).
# Every service a slow test needs is started by the test itself and stopped after it.
# Both suites run even if the first fails; the end of the log has one line per suite (counts,
# durations) and every skipped slow test with its reason. Exit status: non-zero if either
# suite failed. Extra arguments go to both pytest runs.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
cd "$root"
py="${SCALINGNOTE_VENV:-$root/.venv}/bin/python"
reports="${SCALINGNOTE_TEST_REPORTS:-$root/.test-reports}"
mkdir -p "$reports"
rm -f "$reports/default.xml" "$reports/slow.xml"

suite() {  # suite NAME [pytest args...]: run one suite, record its wall time and exit status
  local name="$1"; shift
  echo "=== $name suite: pytest $* ===" >&2
  local t0=$SECONDS rc=0
  bash "$root/scripts/test.sh" --junitxml="$reports/$name.xml" "$@" || rc=$?  # the default suite (README command 2), + its arguments
  [ "$rc" -eq 5 ] && { echo "[$name suite] no tests collected (pytest exit 5): nothing to run" >&2; rc=0; }
  eval "${name}_rc=$rc ${name}_wall=$((SECONDS - t0))"
}

suite default "$@"
SCALINGNOTE_SKIP_CHECKS=1 suite slow -m slow --durations=25 "$@"  # the code checks ran with the default suite

"$py" scripts/suite_summary.py "default=$reports/default.xml@$default_wall" "slow=$reports/slow.xml@$slow_wall" --list-skips slow
echo "exit status: default suite $default_rc, slow suite $slow_rc"
[ "$default_rc" -eq 0 ] && [ "$slow_rc" -eq 0 ]
