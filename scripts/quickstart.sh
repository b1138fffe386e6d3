#!/usr/bin/env bash
# README command 1: create/reuse the pinned environment, then run the main job on the embedded defaults.
# Extra arguments go to `scalingnote quickstart` (e.g. --data ../shared/data/scifact --out runs/scifact,
# --budget-minutes 15 to plan against 15 minutes, --full for the exhaustive run without proxy or budget).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
cd "$root"
exec "${SCALINGNOTE_VENV:-$root/.venv}/bin/scalingnote" quickstart "$@"
