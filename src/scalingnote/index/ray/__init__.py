"""Corpus encoding on a Ray Data actor pool (:mod:`~scalingnote.index.ray.ray_encode`) and the
pool's sizing (:mod:`~scalingnote.index.ray.ray_pool`). Ray is imported on first use."""
