"""The package layering of ``src/scalingnote`` (and of ``benchmarks/`` above it), checked on
the source: every ``import`` / ``from ... import`` anywhere in a module — module level,
function-local, under ``if TYPE_CHECKING`` — may name only its own package or a package of a
strictly lower layer. A function-local import that climbs a layer is still a loop.

The layers, lowest first (packages on one line are peers and may not import each other):

    errors
    utils
    config
    data                      record types, readers/writers, logs -> triplets, ICT pseudo-queries
    evaluation, sparse        metrics (data.types only); BM25 (below training, which mines with it)
    models                    towers; imports nothing of data but data.types
    augment                   LLM pseudo-query generation (needs a causal LM from models)
    training                  Stage I trainer and the shared loop
    distill                   QKD (Stage II) on top of the training loop
    index                     encoding, FAISS / Milvus / hybrid searchers, learned-PQ export adapters
    pq, scaling, live         TMJ learned-PQ stage (exports and verifies through index);
                              scaling-law sweeps / fits; the live index (add / replace / delete
                              with a write-ahead log, generations, drift; ScalingNote §3.5)
    serve                     HTTP service over index
    quickstart                the end-to-end demo pipeline
    cli, api                  ``scalingnote <stage> <verb>``; the Python API (``scalingnote.load``, ``scalingnote.api``)
    __main__                  ``python -m scalingnote``
    benchmarks/               (outside src) may import any of the above; nothing imports it

No two files may import each other, directly or around a loop (any depth, ``TYPE_CHECKING``
blocks included, ``src/`` and ``benchmarks/``): :func:`import_circles` over :func:`import_graph`.

The TMJ learned-PQ stage is a package of its own beside ``distill`` but sits above ``index``:
its last phase writes the learned codebooks into FAISS indexes through the export adapters of
``index.learned_pq`` and verifies them with ``DenseIndex``; ``index`` never imports ``pq``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "scalingnote"

LAYERS: list[tuple[str, ...]] = [
    ("errors",),
    ("utils",),
    ("config",),
    ("data",),
    ("evaluation", "sparse"),
    ("models",),
    ("augment",),
    ("training",),
    ("distill",),
    ("index",),
    ("pq", "scaling", "live"),
    ("serve",),
    ("quickstart",),
    ("cli", "api"),
    ("__main__",),
]
RANK = {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer}
TOP = len(LAYERS)  # benchmarks/


def _module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, mod: str) -> list[tuple[int, str, tuple[str, ...]]]:
    """``(line, imported module, imported names)`` for every import in the file, at any depth."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_pkg = path.name == "__init__.py"
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, a.name, ()) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.append((node.lineno, target, tuple(a.name for a in node.names)))
    return out


def _package(module: str) -> str | None:
    """``scalingnote.index.faiss.dense`` -> ``index``; the bare root package -> None (it imports nothing)."""
    parts = module.split(".")
    if parts[0] != "scalingnote":
        return None
    return parts[1] if len(parts) > 1 else None


def _types_names(src: Path) -> set[str]:
    tree = ast.parse((src / "data" / "types.py").read_text(encoding="utf-8"))
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def layering_violations(root: Path = ROOT) -> list[str]:
    """Every import that names a package of the same or a higher layer (or, from ``models``,
    anything of ``data`` but its record types)."""
    src = root / "src" / "scalingnote"
    bad: list[str] = []
    types_names = _types_names(src)
    files = sorted(src.rglob("*.py")) + sorted((root / "benchmarks").rglob("*.py"))
    for path in files:
        in_src = path.is_relative_to(src)
        mod = _module_name(path, src) if in_src else f"benchmarks.{path.stem}"
        own = _package(mod) if in_src else "benchmarks"
        if in_src and own is not None and own not in RANK:
            bad.append(f"{path.relative_to(root)}: package {own!r} has no layer in tests/test_layering.py")
            continue
        rank = RANK.get(own, TOP) if in_src else TOP
        for line, target, names in _imports(path, mod if in_src else ""):
            where = f"{path.relative_to(root)}:{line}"
            if target.split(".")[0] == "benchmarks" and in_src:
                bad.append(f"{where}: {mod} imports {target} (benchmarks sit above the package)")
                continue
            pkg = _package(target)
            if pkg is None or pkg == own:
                continue
            if pkg not in RANK:
                bad.append(f"{where}: {mod} imports unknown package scalingnote.{pkg}")
            elif RANK[pkg] >= rank:
                bad.append(f"{where}: {mod} (layer {own}) imports {target} (layer {pkg}, not below)")
            elif own == "models" and pkg == "data" and target != "scalingnote.data.types":
                # models may use the data layer's record types only: either the module itself
                # or names that scalingnote.data re-exports from it.
                if target != "scalingnote.data" or not set(names) <= types_names:
                    bad.append(
                        f"{where}: {mod} imports {target} {list(names)} (models may import scalingnote.data.types only)"
                    )
    return bad


def test_no_module_imports_a_higher_layer():
    bad = layering_violations()
    assert not bad, "layering violations:\n" + "\n".join(bad)


def test_scan_sees_function_local_and_relative_imports(tmp_path):
    """The scanner is not blind to imports inside functions: a planted upward import inside a
    function body of a low-layer module is reported."""
    fake_root = tmp_path / "repo"
    fake_src = fake_root / "src" / "scalingnote"
    (fake_src / "data").mkdir(parents=True)
    (fake_src / "serve").mkdir()
    (fake_root / "benchmarks").mkdir()
    (fake_src / "data" / "types.py").write_text("class Document: ...\n")
    (fake_src / "data" / "reader.py").write_text("def f():\n    from scalingnote.serve import app\n    return app\n")
    (fake_src / "data" / "rel.py").write_text("if True:\n    from ..serve.app import X\n")
    (fake_src / "serve" / "app.py").write_text("from scalingnote.data.types import Document\nX = Document\n")
    bad = layering_violations(fake_root)
    assert len(bad) == 2, bad
    assert "reader.py:2" in bad[0] and "(layer serve" in bad[0]
    assert "rel.py:2" in bad[1] and "scalingnote.serve.app" in bad[1]


@pytest.mark.parametrize("pkg", sorted(p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()))
def test_every_package_has_a_layer(pkg):
    assert pkg in RANK, f"scalingnote.{pkg} is not placed in LAYERS (tests/test_layering.py)"


# ----------------------------------------------------------------------------- import circles
def _modules(root: Path) -> dict[str, Path]:
    """Every module of ``src/scalingnote`` and of ``benchmarks/`` by its dotted name."""
    src = root / "src" / "scalingnote"
    mods = {_module_name(p, src): p for p in sorted(src.rglob("*.py"))}
    bench = root / "benchmarks"
    if bench.is_dir():
        mods.update({_module_name(p, bench): p for p in sorted(bench.rglob("*.py"))})
    return mods


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """``module -> modules it imports`` inside ``src/scalingnote`` and ``benchmarks/`` (imports at
    any depth, ``TYPE_CHECKING`` blocks included: a type-only import that closes a loop is still a
    loop a reader must follow). ``from pkg import sub`` counts as importing the submodule
    ``pkg.sub``; a name that is not a submodule counts as importing ``pkg`` (its ``__init__``)."""
    mods = _modules(root)
    graph: dict[str, set[str]] = {}
    for mod, path in mods.items():
        out: set[str] = set()
        for _line, target, names in _imports(path, mod):
            if target not in mods and not any(f"{target}.{n}" in mods for n in names):
                continue
            subs = {f"{target}.{n}" for n in names if f"{target}.{n}" in mods}
            out |= subs
            if target in mods and (not names or len(subs) < len(names)):
                out.add(target)
        out.discard(mod)
        graph[mod] = out
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_import_circle_between_files():
    circles = import_circles(import_graph())
    assert not circles, "modules that import each other (directly or around a loop):\n" + "\n".join(
        " <-> ".join(c) for c in circles
    )


def test_circle_finder_sees_function_local_type_checking_and_benchmark_loops(tmp_path):
    src = tmp_path / "src" / "scalingnote"
    (src / "index").mkdir(parents=True)
    (tmp_path / "benchmarks").mkdir()
    (src / "index" / "__init__.py").write_text("")
    (src / "index" / "a.py").write_text("from scalingnote.index.b import g\n")
    (src / "index" / "b.py").write_text("def g():\n    from scalingnote.index import a\n    return a\n")
    (src / "index" / "c.py").write_text("from scalingnote.index.d import h\n")
    (src / "index" / "d.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from scalingnote.index.c import X\nh = 1\n"
    )
    (src / "index" / "e.py").write_text("from scalingnote.index.a import g\n")  # imports into a loop: not in it
    (tmp_path / "benchmarks" / "x.py").write_text("def f():\n    from benchmarks.y import z\n    return z\n")
    (tmp_path / "benchmarks" / "y.py").write_text("from benchmarks.x import f\nz = f\n")
    assert sorted(import_circles(import_graph(tmp_path))) == [
        ["benchmarks.x", "benchmarks.y"],
        ["scalingnote.index.a", "scalingnote.index.b"],
        ["scalingnote.index.c", "scalingnote.index.d"],
    ]


# ------------------------------------------------------------------ function-local imports
#: most function-local imports of the package's own modules ``src/`` may keep (60 when the rule was set)
LOCAL_IMPORT_BUDGET = 60


def local_own_imports(src: Path = SRC) -> list[tuple[str, int, bool]]:
    """``(file, line, says why)`` for every import statement inside a function body that names
    ``scalingnote`` or a relative module; "says why": a comment on its line or the line above."""
    out = []
    for path in sorted(src.rglob("*.py")):
        lines = path.read_text(encoding="utf-8").splitlines()
        seen: set[int] = set()
        for fn in ast.walk(ast.parse("\n".join(lines), filename=str(path))):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                own = (
                    isinstance(node, ast.ImportFrom)
                    and (node.level > 0 or (node.module or "").split(".")[0] == "scalingnote")
                ) or (isinstance(node, ast.Import) and any(a.name.split(".")[0] == "scalingnote" for a in node.names))
                if own and node.lineno not in seen:
                    seen.add(node.lineno)
                    why = "#" in lines[node.lineno - 1] or lines[node.lineno - 2].strip().startswith("#")
                    out.append((str(path.relative_to(src.parent.parent)), node.lineno, why))
    return sorted(out)


def test_own_modules_are_imported_at_module_level():
    """A module's dependencies are read at its top: a function-local import of the package's own
    modules is kept only to spare a start-up a heavy dependency (torch, Ray), and says so."""
    found = local_own_imports()
    silent = [f"{f}:{n}" for f, n, why in found if not why]
    assert not silent, "function-local imports of scalingnote modules without a comment saying why:\n" + "\n".join(
        silent
    )
    assert len(found) <= LOCAL_IMPORT_BUDGET, (
        f"{len(found)} function-local imports of scalingnote modules (budget {LOCAL_IMPORT_BUDGET})"
    )


def test_local_import_scan_sees_nested_and_relative_imports(tmp_path):
    src = tmp_path / "src" / "scalingnote"
    src.mkdir(parents=True)
    (src / "m.py").write_text(
        "def f():\n    def g():\n        from . import x\n    # why: heavy\n    import scalingnote.y\n    import json\n"
    )
    assert local_own_imports(src) == [("src/scalingnote/m.py", 3, False), ("src/scalingnote/m.py", 5, True)]
