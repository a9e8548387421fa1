"""The tree's shape: no import circles among tailgate's modules, each side importing only what it may, and
one name per file.

The import graph is read statically (``ast``), every ``import`` counted wherever it stands (inside a
function or under ``TYPE_CHECKING`` too): a circle hidden in a function is still two modules that cannot
be understood, tested or moved one without the other.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {
    "tailgate": ROOT / "tailgate",
    "tailgate.shapes": ROOT / "shapes",
    "tailgate.locustfiles": ROOT / "locustfiles",
    "tailgate.postprocess": ROOT / "postprocess",
}
PRODUCT_LINES = 600


def modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for prefix, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([prefix, *parts])] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the tailgate modules it imports (``from pkg import mod`` counts as ``pkg.mod``)."""
    mods = modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                    base = f"{base}.{node.module}" if node.module else base
                else:
                    base = node.module or ""
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for target in targets:
                while target not in mods and "." in target:
                    target = target.rpartition(".")[0]
                if target in mods and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles_among_tailgate_modules() -> None:
    graph = import_graph()
    assert graph["tailgate.slo.command"], "the graph reads no imports: the finder is broken"
    assert cycles(graph) == []


@pytest.mark.parametrize(
    ("module", "forbidden"),
    [
        ("tailgate.load.hooks", "tailgate.servers"),  # the load path does not start servers
        # the search and its verdicts read JSONL, never the analysis (the command builds the report at the end)
        ("tailgate.slo.spec", "tailgate.postprocess"),
        ("tailgate.slo.verdict", "tailgate.postprocess"),
        ("tailgate.slo.search", "tailgate.postprocess"),
        ("tailgate.slo.probe", "tailgate.postprocess"),
        ("tailgate.runner", "tailgate.postprocess"),
        ("tailgate.load", "tailgate.suite"),
    ],
)
def test_each_side_imports_only_what_it_may(module: str, forbidden: str) -> None:
    graph = import_graph()
    offenders = {
        (m, t) for m, targets in graph.items() if m == module or m.startswith(module + ".")
        for t in targets if t == forbidden or t.startswith(forbidden + ".")
    }  # fmt: skip
    assert offenders == set()


def test_no_product_file_above_the_size_limit() -> None:
    """Small modules, each with one job; a file that grows past the limit is split by role, not exempted."""
    exempt: set[str] = set()
    big = {}
    for folder in PACKAGES.values():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(ROOT).as_posix()
            lines = path.read_text().count("\n")
            if lines > PRODUCT_LINES and rel not in exempt:
                big[rel] = lines
    assert big == {}


@pytest.mark.parametrize("folder", ["shapes", "locustfiles", "postprocess"])
def test_a_bare_checkout_gives_each_file_one_name(folder: str, tmp_path: Path) -> None:
    """With the root on ``sys.path`` (``PYTHONPATH=.``), ``shapes.base`` would be a second copy of
    ``tailgate.shapes.base``: its Locust listeners registered twice. Only the ``tailgate.`` name loads."""
    code = (
        "import importlib, sys\n"
        f"pkg = importlib.import_module('tailgate.{folder}')\n"
        f"assert pkg.__file__.startswith({str(ROOT)!r}), pkg.__file__\n"
        "try:\n"
        f"    importlib.import_module('{folder}')\n"
        "except ImportError as e:\n"
        f"    assert 'tailgate.{folder}' in str(e), e\n"
        "else:\n"
        f"    raise SystemExit('{folder} imported under a second name')\n"
        f"assert not [m for m in sys.modules if m == '{folder}' or m.startswith('{folder}.')]\n"
    )
    # -S: no site-packages, so no installed tailgate (nor its editable finder): the checkout alone
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-S", "-c", code], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]


def test_every_path_architecture_names_exists() -> None:
    """The map must match the ground: a moved module is moved in ARCHITECTURE.md too."""
    import re

    text = (ROOT / "ARCHITECTURE.md").read_text()
    named = set(re.findall(r"`([\w./-]+/[\w./-]*)`", text))
    paths = {n for n in named if n.endswith((".py", "/")) and not n.startswith(("http", "/"))}
    assert "tailgate/runner.py" in paths, "the reader found no paths"
    assert sorted(p for p in paths if not (ROOT / p).exists()) == []


def test_no_module_imports_another_modules_private_name() -> None:
    """A leading underscore says "only this module relies on it": a name another module imports is shared API
    (public, in the module that owns the role) or belongs in the module that uses it."""
    offenders = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                private = [a.name for a in node.names if a.name.startswith("_") and not a.name.endswith("__")]
                offenders += [f"{name}:{node.lineno} {'.' * node.level}{node.module or ''}.{p}" for p in private]
    assert offenders == []


def product_paths() -> list[str]:
    """Every Python file of the product, as a path from the repository root."""
    return sorted(p.relative_to(ROOT).as_posix() for folder in PACKAGES.values() for p in folder.rglob("*.py"))


def test_architecture_names_every_module() -> None:
    """A module the map does not name is one a newcomer cannot place: each needs its line in the module map."""
    import re

    named = set(re.findall(r"`([\w./-]+\.py)`", (ROOT / "ARCHITECTURE.md").read_text()))
    assert len(product_paths()) > 100, "the walk found too few modules"
    assert [p for p in product_paths() if p not in named] == []


@pytest.mark.parametrize("doc", ["ARCHITECTURE.md", "README.md"])
def test_every_tailgate_module_a_doc_names_exists(doc: str) -> None:
    """A ``tailgate/...py`` path in prose (quoted or not) must be a file: a rename moves the docs too."""
    import re

    named = set(re.findall(r"(?<![\w/.-])tailgate/[\w/]+\.py\b", (ROOT / doc).read_text()))
    assert sorted(p for p in named if not (ROOT / p).is_file()) == []
