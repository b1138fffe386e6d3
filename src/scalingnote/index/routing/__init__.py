"""Routing for asymmetric towers: the routed structures and their search
(:mod:`~scalingnote.index.routing.routing`), query-guided graph edges
(:mod:`~scalingnote.index.routing.query_graph`) and the choice of the served method on validation
queries (:mod:`~scalingnote.index.routing.method_tune`)."""
