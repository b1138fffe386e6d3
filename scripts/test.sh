#!/usr/bin/env bash
# README command 2 (and CI): set up the environment if needed, then run the default test suite.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m slow`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
cd "$root"
exec "${SCALINGNOTE_VENV:-$root/.venv}/bin/python" -m pytest "$@"
