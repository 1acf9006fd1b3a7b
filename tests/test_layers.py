"""The import rules of the house (DESIGN.md, "Where things live"), checked on the source.

Every import counts, function-level ones included; only `if TYPE_CHECKING:` blocks are left
out, as they never run. Generated stubs (cruxd/rpc/gen) are not ours to check.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("cruxd", "transport", "probing")
IO_MODULES = ("grpc", "socket", "asyncio", "subprocess", "pynvml", "pyverbs")
PURE_CORE = ("cruxd.model", "cruxd.scheduler", "cruxd.sim", "cruxd.control", "cruxd.measure")
SAMPLERS = ("cruxd.measure.sampling",)  # measure/'s I/O half; the estimators beside it are pure
SHELLS = ("cruxd.daemon", "cruxd.cli")  # the process shell and the commands sit on top


def _name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.AST) -> set[str]:
    out: set[str] = set()
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        out |= _imports(node)
    return out


MODULES = {_name(p): _imports(ast.parse(p.read_text()))
           for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))
           if "gen" not in p.relative_to(REPO).parts}


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def offenders(importers: tuple[str, ...], imported: tuple[str, ...],
              exempt: tuple[str, ...] = ()) -> list[str]:
    return sorted(f"{m} imports {i}" for m, imps in MODULES.items()
                  if _under(m, importers) and not _under(m, exempt)
                  for i in imps if _under(i, imported))


def test_the_scan_sees_the_tree() -> None:
    assert {"cruxd.agent.core", "cruxd.config.parse", "transport.native", "probing.sweep"} \
        <= set(MODULES)


def test_nothing_below_the_shell_imports_it() -> None:
    assert offenders(("cruxd",), ("cruxd.daemon",), exempt=SHELLS) == []


def test_transport_and_probing_stand_alone() -> None:
    assert offenders(("transport", "probing"), ("cruxd",)) == []


def test_the_pure_core_does_no_io() -> None:
    assert offenders(PURE_CORE, IO_MODULES, exempt=SAMPLERS) == []


def test_the_pure_estimators_do_not_reach_the_samplers() -> None:
    assert offenders(PURE_CORE, SAMPLERS, exempt=SAMPLERS) == []


def test_no_import_cycles() -> None:
    graph = {m: {i for i in imps if i in MODULES and i != m} for m, imps in MODULES.items()}
    cycles: list[list[str]] = []
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []

    def strongconnect(v: str) -> None:  # Tarjan: every strongly connected set is a cycle
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while (w := stack.pop()) != v:
                comp.append(w)
            if comp:
                cycles.append(sorted([v, *comp]))

    for v in graph:
        if v not in index:
            strongconnect(v)
    assert cycles == []


def test_only_tests_and_benchmarks_use_the_rig() -> None:
    assert offenders(PACKAGES, ("cruxd.testing",), exempt=("cruxd.testing",)) == []
