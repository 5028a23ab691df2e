"""The package's import graph: no cycle among gpunn's modules, counting imports inside functions too (a deferred
import hides a cycle, it does not remove it), and planning the workflow loads neither matplotlib nor numba."""

import ast
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"


def _modules() -> dict[str, Path]:
    found = {}
    for path in SRC.joinpath("gpunn").rglob("*.py"):
        parts = path.relative_to(SRC).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _targets(module: str, node, modules) -> list[str]:
    """The gpunn modules one import statement loads by name: `import a.b`, `from a import b` (the module a.b when
    it is one, else a), relative forms resolved against `module`."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        package = module.split(".") if modules[module].name == "__init__.py" else module.split(".")[:-1]
        base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    submodules = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in modules]
    return submodules + ([base] if len(submodules) < len(node.names) else [])


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _targets(name, node, modules):
                    while target and target not in modules:  # `import gpunn.x.y` of a name inside a module
                        target = target.rpartition(".")[0]
                    if target.startswith("gpunn") and target != name:
                        graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = counter[0]
                    counter[0] += 1
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph[succ]))))
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            else:
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


def test_the_cycle_finder_finds_a_cycle_through_a_deferred_import():
    graph = {"gpunn.a": {"gpunn.b"}, "gpunn.b": {"gpunn.c"}, "gpunn.c": {"gpunn.a"}, "gpunn.d": {"gpunn.a"}}
    assert cycles(graph) == [["gpunn.a", "gpunn.b", "gpunn.c"]]
    assert cycles({"gpunn.a": {"gpunn.b"}, "gpunn.b": set()}) == []


def test_the_graph_sees_function_level_and_relative_imports():
    graph = import_graph()
    assert "gpunn.backends.base" in graph["gpunn.backends.cpu_numpy"]  # `from .base import ...`
    assert "gpunn.kernels.gemm" in graph["gpunn.backends.gpu.layers"]  # inside a method
    assert "gpunn.nn.functional" in graph["gpunn.kernels.conv.reference"]  # `from gpunn.nn import functional as F`
    assert "gpunn.kernels.gemm.versions" in graph["gpunn.kernels.gemm.split_k"]  # `from .versions import ...`


def test_no_import_cycle_in_gpunn():
    found = cycles(import_graph())
    assert not found, f"import cycles (function-level imports count): {found}"


def test_planning_the_workflow_loads_neither_matplotlib_nor_numba():
    """The gpunn modules the Snakefile imports (workflow/rules/common.smk) load no plotting and no CUDA: a dry run
    stays quick and works where neither is usable."""
    common = (REPO / "workflow/rules/common.smk").read_text()
    statements = re.findall(r"^from gpunn[\w.]* import (?:\([^)]*\)|[^\n]*)", common, flags=re.MULTILINE)
    assert any("gpunn.targets" in s for s in statements) and any("captions" in s for s in statements)
    code = "import sys\n" + "".join(f"{s}\n" for s in statements) + (
        "print(sorted(m for m in ('matplotlib', 'numba', 'numba.cuda') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
