"""Every op family module is imported by ``dpgraph.ops`` itself, so its operators exist for
any net, whatever else the program imported (an op registered only as a side effect of
importing a modeling or pass module is missing from a plain ``workspace.RunOperatorOnce``)."""

from __future__ import annotations

import ast
from pathlib import Path

import dpgraph.ops

OPS = Path(dpgraph.ops.__file__).resolve().parent


def _registers_ops(path: Path) -> bool:
    """True if the module calls ``register_op`` / ``register_gradient`` at import time."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            if name in ("register_op", "register_gradient"):
                return True
    return False


def test_every_registering_module_is_a_listed_family() -> None:
    registering = {p.stem for p in OPS.glob("*.py")
                   if not p.stem.startswith("_") and _registers_ops(p)}
    missing = sorted(registering - set(dpgraph.ops._FAMILIES))
    assert not missing, (
        f"dpgraph/ops/{{{','.join(missing)}}}.py register operators but are not in "
        "_FAMILIES in src/dpgraph/ops/__init__.py; add them there.")


def test_every_listed_family_exists_and_registers() -> None:
    listed = list(dpgraph.ops._FAMILIES)
    assert len(listed) == len(set(listed)), "a family is listed twice"
    empty = [name for name in listed if not _registers_ops(OPS / f"{name}.py")]
    assert not empty, f"families registering no operator (placeholders?): {empty}"
