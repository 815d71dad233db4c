"""The package's import graph: no module of gear_jax imports itself back, at import time or later.

`python tests/unit/test_imports.py [PACKAGE_DIR]` prints the graph (module -> the gear_jax modules it imports;
deferred imports, made inside a function, marked with *), and the circles it finds.

One kind of circle stays, written down here with its reason: `Table`'s methods are users' spellings of
functions that live in modules which need `Table` themselves (`table.sample(...)` is
`gear_jax.sample(table, ...)`, `table.save(path)` is `gear_jax.checkpoint.save(table, path)`, an insert
or an episode step of CUDA tensors goes through `gear_jax.torch`). Those imports are deferred to the
call, so that importing `gear_jax.table` never needs them; a module-level import may never close a
circle.
"""

from __future__ import annotations

import ast
import pathlib
import sys

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "gear_jax"

# (importer, imported) deferred imports allowed to close a circle, with the reason above.
USERS_SPELLINGS = {
    ("table", "ops"),  # Table.sample, gather, sample_batch, update_priorities
    ("table", "checkpoint"),  # Table.save, Table.load
    ("sharded", "sharded_checkpoint"),  # ShardedTable.save, ShardedTable.load
    ("table", "torch"),  # Table.insert of CUDA tensors
    ("writers", "torch"),  # EpisodeWriter.append of CUDA tensors
}


def import_graph(package: pathlib.Path = PACKAGE) -> dict[str, dict[str, bool]]:
    """module -> {imported gear_jax module: deferred?} for every module of the package."""
    graph: dict[str, dict[str, bool]] = {}
    for path in sorted(package.glob("*.py")):
        module = path.stem
        tree = ast.parse(path.read_text(), str(path))
        edges: dict[str, bool] = {}
        top_level = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module == "gear_jax":
                    targets = [alias.name for alias in node.names]
                elif node.module.startswith("gear_jax."):
                    targets = [node.module.split(".")[1]]
            elif isinstance(node, ast.Import):
                targets = [a.name.split(".")[1] for a in node.names if a.name.startswith("gear_jax.")]
            for target in targets:
                if target == module or not (package / f"{target}.py").exists():
                    continue
                deferred = id(node) not in top_level and not _in_type_checking(tree, node)
                if _in_type_checking(tree, node):
                    continue  # annotations only: never imported at run time
                edges[target] = edges.get(target, True) and deferred
        graph[module] = edges
    return graph


def _in_type_checking(tree: ast.Module, node: ast.AST) -> bool:
    for block in tree.body:
        if isinstance(block, ast.If) and ast.unparse(block.test).endswith("TYPE_CHECKING"):
            if any(inner is node for inner in ast.walk(block)):
                return True
    return False


def circles(graph: dict[str, dict[str, bool]], allowed: set[tuple[str, str]]) -> list[list[str]]:
    """Every elementary circle (as a module list) that uses no edge of `allowed`."""
    edges = {m: sorted(t for t in targets if (m, t) not in allowed) for m, targets in graph.items()}
    found: list[list[str]] = []

    def walk(start: str, node: str, path: list[str]) -> None:
        for nxt in edges.get(node, []):
            if nxt == start:
                found.append([*path, start])
            elif nxt not in path and nxt > start:  # each circle once, from its smallest module
                walk(start, nxt, [*path, nxt])

    for start in sorted(edges):
        walk(start, start, [start])
    return found


def test_module_level_imports_make_no_circle():
    graph = import_graph()
    module_level = {m: {t: d for t, d in targets.items() if not d} for m, targets in graph.items()}
    assert circles(module_level, set()) == []


def test_the_only_deferred_circles_are_the_tables_users_spellings():
    graph = import_graph()
    assert circles(graph, USERS_SPELLINGS) == []
    for importer, imported in USERS_SPELLINGS:
        assert graph[importer].get(imported) is True, f"{importer} -> {imported} must stay deferred"


def test_the_graph_finds_a_circle_where_there_is_one(tmp_path):
    (tmp_path / "a.py").write_text("from gear_jax.b import x\n")
    (tmp_path / "b.py").write_text("def f():\n    from gear_jax import a\n")
    graph = import_graph(tmp_path)
    assert graph == {"a": {"b": False}, "b": {"a": True}}
    assert circles(graph, set()) == [["a", "b", "a"]]
    assert circles(graph, {("b", "a")}) == []


if __name__ == "__main__":
    where = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else PACKAGE
    graph = import_graph(where)
    for module, targets in graph.items():
        shown = ", ".join(f"{t}*" if deferred else t for t, deferred in sorted(targets.items()))
        print(f"{module:14s} -> {shown}")
    print("circles:", circles(graph, set()) or "none")
    print("circles beside the Table's users' spellings:", circles(graph, USERS_SPELLINGS) or "none")
