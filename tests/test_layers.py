"""The layer order, as a test: every import in ``src/dpgraph`` points down (or sideways).

The order (docs/architecture.md draws it; ../shared/DESIGN.md says where new work goes)::

    facade > passes > modeling > autodiff > runtime > ops > ir

``LAYERS`` below is the one table: to add a package, declare it there (a subpackage that is
not declared fails this test).  A top-level module (``dpgraph/<name>.py``) not declared in a
lower layer is a facade: Caffe2-named modules re-export and may import anything.

Every ``import`` / ``from ... import`` counts, at module level or inside a function, and so
does ``importlib.import_module("<literal>")``; only imports under ``if TYPE_CHECKING:`` (no
run-time dependency) are skipped.  Deliberate exceptions are listed in ``EXCEPTIONS`` with
their reason, and explained in docs/architecture.md; an exception that no longer occurs fails
the test too, so the list stays true.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "dpgraph"

#: Layer ranks, lowest first; an import may only name a module of the same or a lower rank.
LAYER_NAMES = ["ir", "ops", "runtime", "autodiff", "modeling", "passes", "facade"]

#: ``dpgraph.<name>`` (subpackage or top-level module) -> layer.  THE table: declare new
#: packages here.  Top-level modules not listed are facades.
LAYERS: dict[str, str] = {
    # ir: the NetDef IR of record, its schema and the typed errors everything raises
    "proto": "ir", "ir": "ir", "errors": "ir",
    # ops: one module per op family (schema + kernel + gradient maker)
    "ops": "ops",
    # runtime: workspaces, executors, devices; collective backends; DBs; data input
    "runtime": "runtime", "collectives": "runtime", "db": "runtime", "data": "runtime",
    # autodiff: gradient registry and the backward pass
    "autodiff": "autodiff",
    # modeling: ModelHelper, brew, optimizers, RNN cells; jobs (schema/net_builder/task/session)
    "modeling": "modeling", "jobs": "modeling",
    # passes: Parallelize and friends, memory passes, export (predictor, ONNX, DOT)
    "parallel": "passes", "memory": "passes", "export": "passes",
    # facade packages (top-level modules need no entry): Caffe2-named, they re-export
    "compat": "facade", "predictor": "facade", "models": "facade", "rnn": "facade",
    "serialized_test": "facade", "operator_test": "facade",
}

#: ``(importing module, imported module) -> why``: deliberate upward edges.  Keep in step
#: with the "Deliberate exceptions" section of docs/architecture.md.
EXCEPTIONS: dict[tuple[str, str], str] = {}

#: Upward edges still being fixed, with the reason (empty: issue 14's are all fixed).
PENDING: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int

    def describe(self) -> str:
        return (f"{self.source} ({layer_of(self.source)}) imports {self.target} "
                f"({layer_of(self.target)}) at line {self.line}")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> str:
    """The layer of ``dpgraph[.<name>...]``; an undeclared subpackage raises."""
    parts = module.split(".")
    if len(parts) == 1:
        return "facade"
    name = parts[1]
    if name in LAYERS:
        return LAYERS[name]
    if (PACKAGE / name / "__init__.py").exists():
        raise AssertionError(
            f"package dpgraph.{name} has no layer: declare it in LAYERS in "
            f"tests/test_layers.py (and in the layer diagram of docs/architecture.md).")
    return "facade"


def _rank(module: str) -> int:
    return LAYER_NAMES.index(layer_of(module))


def _is_package_member(module: str) -> bool:
    path = SRC.joinpath(*module.split("."))
    return path.is_dir() or path.with_suffix(".py").exists()


def _from_targets(node: ast.ImportFrom, source: str, is_package: bool) -> list[str]:
    if node.level:
        base = source.split(".") if is_package else source.split(".")[:-1]
        base = base[:len(base) - node.level + 1]
        module = ".".join(base + ([node.module] if node.module else []))
    else:
        module = node.module or ""
    # ``from dpgraph import workspace`` imports the module dpgraph.workspace
    return [f"{module}.{alias.name}" if _is_package_member(f"{module}.{alias.name}") else module
            for alias in node.names]


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    return skipped


def _targets(node: ast.AST, source: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        return _from_targets(node, source, is_package)
    if isinstance(node, ast.Call) and ast.unparse(node.func) in (
            "importlib.import_module", "import_module", "__import__"):
        if node.args and isinstance(node.args[0], ast.Constant) and \
                isinstance(node.args[0].value, str):
            return [node.args[0].value]
    return []


def imports_of(path: Path) -> list[Edge]:
    """Every dpgraph module ``path`` imports, with the line."""
    source = module_name(path)
    tree = ast.parse(path.read_text(), str(path))
    skipped = _type_checking_nodes(tree)
    edges = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        for target in _targets(node, source, path.name == "__init__.py"):
            if target == "dpgraph" or target.startswith("dpgraph."):
                edges.append(Edge(source, target, getattr(node, "lineno", 0)))
    return edges


def all_edges() -> list[Edge]:
    return [edge for path in sorted(PACKAGE.rglob("*.py")) for edge in imports_of(path)]


def upward_edges() -> list[Edge]:
    return [edge for edge in all_edges() if _rank(edge.target) > _rank(edge.source)]


def _key(edge: Edge) -> tuple[str, str]:
    return (edge.source, edge.target)


def test_every_package_is_declared() -> None:
    for child in sorted(PACKAGE.iterdir()):
        if child.is_dir() and (child / "__init__.py").exists():
            layer_of(f"dpgraph.{child.name}")  # raises for an undeclared package


def test_imports_point_down_the_layers() -> None:
    allowed = set(EXCEPTIONS) | set(PENDING)
    bad = [edge.describe() for edge in upward_edges() if _key(edge) not in allowed]
    assert not bad, (
        "imports pointing up the layer order " + " > ".join(reversed(LAYER_NAMES))
        + " (move the code down, pass what varies explicitly, or list a deliberate exception "
        "in EXCEPTIONS and docs/architecture.md):\n  " + "\n  ".join(sorted(set(bad))))


def test_listed_exceptions_still_occur() -> None:
    present = {_key(edge) for edge in upward_edges()}
    stale = sorted(set(EXCEPTIONS) - present) + sorted(set(PENDING) - present)
    assert not stale, f"exceptions that no longer occur (remove them): {stale}"


def test_exceptions_are_explained_in_the_architecture_doc() -> None:
    doc = (SRC.parent / "docs" / "architecture.md").read_text()
    missing = [f"{source} -> {target}" for source, target in EXCEPTIONS
               if f"`{source}` -> `{target}`" not in doc]
    assert not missing, f"explain these exceptions in docs/architecture.md: {missing}"


# --- the checker itself -----------------------------------------------------------------------
def _edges_of(tmp_path: Path, code: str, name: str = "mod.py") -> list[str]:
    path = tmp_path / name
    path.write_text(code)
    tree_edges = []
    source = "dpgraph.ir.mod"
    tree = ast.parse(code)
    skipped = _type_checking_nodes(tree)
    for node in ast.walk(tree):
        if id(node) not in skipped:
            tree_edges += _targets(node, source, False)
    return tree_edges


def test_checker_sees_every_kind_of_import(tmp_path: Path) -> None:
    code = ("import dpgraph.autodiff\n"
            "from dpgraph import workspace\n"
            "from ..runtime import devices\n"
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from dpgraph.modeling import ModelHelper\n"
            "def f():\n    import importlib\n    importlib.import_module('dpgraph.parallel')\n")
    edges = _edges_of(tmp_path, code)
    assert "dpgraph.autodiff" in edges and "dpgraph.workspace" in edges
    assert "dpgraph.runtime.devices" in edges and "dpgraph.parallel" in edges
    assert "dpgraph.modeling" not in edges


def test_layer_table() -> None:
    assert layer_of("dpgraph.workspace") == "facade"
    assert layer_of("dpgraph.errors") == "ir"
    assert layer_of("dpgraph.collectives.gloo") == "runtime"
    assert _rank("dpgraph.parallel.config") > _rank("dpgraph.modeling.model_helper")


def test_an_undeclared_package_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(LAYERS, "memory")
    with pytest.raises(AssertionError, match="declare it in LAYERS in tests/test_layers.py"):
        layer_of("dpgraph.memory.graph")
