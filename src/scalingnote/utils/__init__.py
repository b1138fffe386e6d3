"""Small shared helpers: atomic file output, run metadata, seeding."""

from scalingnote.utils.io import atomic_path, atomic_write, write_json
from scalingnote.utils.runinfo import machine_description, package_versions, run_metadata, seed_everything

__all__ = [
    "atomic_path",
    "atomic_write",
    "write_json",
    "machine_description",
    "package_versions",
    "run_metadata",
    "seed_everything",
]
