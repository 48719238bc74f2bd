"""Import hygiene of the ``dualemb`` package (issue 8: one concern per module, no import cycle).

1. Every module of ``dualemb/`` imports in a fresh interpreter, in sorted and in reverse order:
   a module that only works when something else was imported first (or that closes an import
   cycle which happens to resolve in one order only) fails in one of them.
2. The intra-package import graph, read from the source with ``ast``, has no cycle. Imports inside
   functions count as edges too: a lazy import that breaks a cycle at run time hides a circular
   design, which is what this check refuses.

Graph conventions: ``import a.b`` and ``from a import b`` (b a submodule) are edges to ``a.b``;
``from a import name`` (name not a submodule) is an edge to the package ``a`` (its
``__init__``). The implicit import of a module's parent packages is not an edge: a package's
``__init__`` re-exporting its submodules is the normal facade, and a submodule that imports a name
from that facade shows up as an edge to the package, which closes the cycle.
"""

from __future__ import annotations

import ast
import os
import pathlib
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor


from _paths import ROOT
PACKAGE = ROOT / "dualemb"


def modules_of(package_dir: pathlib.Path) -> dict[str, pathlib.Path]:
    """Dotted module name -> source file, for every .py under package_dir (a package's name
    maps to its __init__.py)."""
    out = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imported(module: str, node, is_package: bool, modules: dict) -> list[str]:
    """The package modules one import statement of ``module`` reaches."""
    top = next(iter(modules)).split(".")[0]
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:  # relative: resolved against the importing module's package
            package = module.split(".") if is_package else module.split(".")[:-1]
            package = package[:len(package) - node.level + 1]
            base = ".".join(package + ([base] if base else []))
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                 for a in node.names]
    out = []
    for name in names:
        # `import a.b.c` names a.b.c; keep the longest prefix that is a module of the package.
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name and name.split(".")[0] == top:
            out.append(name)
    return out


def import_graph(package_dir: pathlib.Path) -> dict[str, set[str]]:
    """module -> the package modules it imports, at module level or inside any function."""
    modules = modules_of(package_dir)
    graph = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        edges = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges.update(_imported(module, node, path.name == "__init__.py", modules))
        edges.discard(module)
        graph[module] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as [m0, m1, ..., m0], or None (iterative depth-first search)."""
    WHITE, GREY, BLACK = 0, 1, 2
    color = dict.fromkeys(graph, WHITE)
    for start in sorted(graph):
        if color[start] != WHITE:
            continue
        stack = [(start, iter(sorted(graph[start])))]
        path = [start]
        color[start] = GREY
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                color[node] = BLACK
                stack.pop()
                path.pop()
            elif color.get(child, BLACK) == GREY:
                return path[path.index(child):] + [child]
            elif color.get(child) == WHITE:
                color[child] = GREY
                stack.append((child, iter(sorted(graph[child]))))
                path.append(child)
    return None


# ---- the checker itself can fail ------------------------------------------------------------------

def _write(root: pathlib.Path, files: dict) -> pathlib.Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "pkg"


def test_checker_finds_a_cycle_closed_by_a_function_level_import(tmp_path):
    pkg = _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg import b\n",
        "pkg/b.py": "def f():\n    from pkg.c import g\n    return g\n",
        "pkg/c.py": "from . import a\n",
    })
    graph = import_graph(pkg)
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == {"pkg.c"}
    assert graph["pkg.c"] == {"pkg.a"}
    cycle = find_cycle(graph)
    assert cycle is not None and cycle[0] == cycle[-1]
    assert set(cycle) == {"pkg.a", "pkg.b", "pkg.c"}


def test_checker_counts_names_imported_from_a_package_facade(tmp_path):
    pkg = _write(tmp_path, {
        "pkg/__init__.py": "from pkg.sub.x import X\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/x.py": "import pkg.sub.y\nX = 1\n",
        "pkg/sub/y.py": "from pkg import X\n",  # a name, not a module: an edge to pkg
    })
    graph = import_graph(pkg)
    assert graph["pkg.sub.x"] == {"pkg.sub.y"} and graph["pkg.sub.y"] == {"pkg"}
    assert set(find_cycle(graph)) == {"pkg", "pkg.sub.x", "pkg.sub.y"}


def test_checker_accepts_an_acyclic_graph(tmp_path):
    pkg = _write(tmp_path, {
        "pkg/__init__.py": "from pkg import a, b\n",
        "pkg/a.py": "import json\nfrom pkg import b\n",
        "pkg/b.py": "def f():\n    import os\n",
    })
    assert find_cycle(import_graph(pkg)) is None


# ---- dualemb ---------------------------------------------------------------------------------------

def test_dualemb_import_graph_has_no_cycle():
    graph = import_graph(PACKAGE)
    # The walk sees the front ends and the saving modules (a broken walk would pass vacuously).
    for module in ("dualemb.tf.variable", "dualemb.tf.saving.tf_checkpoint", "dualemb.jax.ops",
                   "dualemb.core.checkpoint._load", "dualemb.demo.cli"):
        assert module in graph
    assert "dualemb.tf.saving.tf_checkpoint" in graph["dualemb.tf.variable"]
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def _import_in_order(modules: list) -> tuple[int, str]:
    """Imports ``modules`` one after the other in one fresh interpreter; on failure the
    traceback names the module."""
    code = ("import importlib, os, sys\n"
            "for m in os.environ['DUALEMB_IMPORT_ORDER'].split():\n"
            "    print('importing', m, file=sys.stderr, flush=True)\n"
            "    importlib.import_module(m)\n")
    env = dict(os.environ, DUALEMB_IMPORT_ORDER=" ".join(modules))
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    return proc.returncode, proc.stderr[-3000:]


def test_every_module_imports_in_a_fresh_interpreter():
    """Every module imports, in two fresh interpreters: one in sorted order (a package before its
    submodules), one in reverse order (submodules first). One interpreter per module would be
    stronger, but costs a TensorFlow import per module (about 6 min of CPU for 110 modules, a
    third of CI's budget); a module that needs another imported first fails in one of the two
    orders unless that other module sorts before it both ways, and the static graph check above
    refuses the cycles through which such a dependency usually hides."""
    # ``__main__`` modules are scripts (importing one runs it); the package they belong to is
    # imported.
    modules = sorted(m for m in modules_of(PACKAGE) if not m.endswith(".__main__"))
    for front_end in ("dualemb.tf", "dualemb.jax", "dualemb.core", "dualemb.demo"):
        assert any(m.startswith(front_end + ".") for m in modules), front_end
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(_import_in_order, [modules, modules[::-1]]))
    failed = [err for rc, err in results if rc != 0]
    assert not failed, "\n\n".join(failed)
