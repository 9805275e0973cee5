"""Small functions and small stateful classes in the package, the launcher included. Records
(dataclasses, models) mirror formats and are measured by their formats' docs, not here."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "sidecar"
MAX_FUNCTION_LINES = 60
MAX_INSTANCE_ATTRIBUTES = 10
MAX_MODULE_LINES = 400


def modules() -> list[tuple[Path, ast.Module]]:
    return [(path, ast.parse(path.read_text(encoding="utf-8"))) for path in sorted(PACKAGE.rglob("*.py"))]


def lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    return (node.end_lineno or node.lineno) - node.lineno + 1


def test_no_function_is_longer_than_a_screen() -> None:
    long = [
        f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name} ({lines(node)} lines)"
        for path, tree in modules()
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and lines(node) > MAX_FUNCTION_LINES
    ]
    assert not long, "split these functions:\n" + "\n".join(long)


def instance_attributes(cls: ast.ClassDef) -> set[str]:
    return {
        node.attr
        for node in ast.walk(cls)
        if isinstance(node, ast.Attribute)
        and isinstance(node.ctx, ast.Store)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    }


def test_no_class_keeps_more_than_ten_pieces_of_state() -> None:
    big = [
        f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name} ({len(attrs)}: {sorted(attrs)})"
        for path, tree in modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        and len(attrs := instance_attributes(node)) > MAX_INSTANCE_ATTRIBUTES
    ]
    assert not big, "split these classes:\n" + "\n".join(big)


def test_no_module_is_longer_than_one_concept_needs() -> None:
    long = {
        str(path.relative_to(PACKAGE)): count
        for path in sorted(PACKAGE.rglob("*.py"))
        if (count := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"split these by concept (at most {MAX_MODULE_LINES} lines each): {long}"


def test_the_checks_see_what_they_measure() -> None:
    body = "".join(f"        self.a{i} = {i}\n" for i in range(11))
    tree = ast.parse("class A:\n    def __init__(self):\n" + body)
    (cls,) = [node for node in tree.body if isinstance(node, ast.ClassDef)]
    assert len(instance_attributes(cls)) == 11
