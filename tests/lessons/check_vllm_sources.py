"""Re-check `vllm_sources.json` against an installed vLLM: `python tests/lessons/check_vllm_sources.py
/path/to/site-packages`. Not a test (CI has no vLLM): run it when moving the lessons to a new vLLM.

Every listed file must exist there and define every listed name: a top-level function, class,
constant or import (`name`), or a method, attribute or nested class of a class in that file
(`Class.name`).
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

SOURCES = Path(__file__).with_name("vllm_sources.json")


def defined_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()

    def targets(node: ast.stmt) -> list[str]:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return [node.name]
        if isinstance(node, ast.Assign):
            return [t.id for t in node.targets if isinstance(t, ast.Name)]
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            return [node.target.id]
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            return [(a.asname or a.name).split(".")[0] for a in node.names]
        return []

    for node in tree.body:
        names.update(targets(node))
        if isinstance(node, ast.ClassDef):
            for member in node.body:
                names.update(f"{node.name}.{n}" for n in targets(member))
    return names


def main(root: str) -> int:
    files = json.loads(SOURCES.read_text())["files"]
    bad = 0
    for path, entry in files.items():
        source = Path(root) / path
        if not source.is_file():
            print(f"missing file: {path}")
            bad += 1
            continue
        found = defined_names(ast.parse(source.read_text()))
        for name in entry["names"]:
            if name not in found:
                print(f"{path}: no `{name}`")
                bad += 1
    print(f"{len(files)} files, {bad} problems")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
