#!/usr/bin/env python3
"""Check the house rules (../shared/ARCHITECTURE.md) on builder/; stdlib only.

Usage::

    python3 scripts/check-architecture.py            # every rule; exit 1 and print what violates
    python3 scripts/check-architecture.py --rule cycles --rule size
    python3 scripts/check-architecture.py --list     # the rule names

Rules:
  size         no module over 500 lines
  parents      no ``Path(__file__).resolve().parents[`` asset lookups (importlib.resources instead)
  cycles       no import circle among builder modules, counting imports inside functions too
  deferred     an import of a builder module inside a function says why in a comment on its line
               ("deferred: ..."): only an optional extra or a heavy third-party import is a reason
  floors       builder/core/ imports nothing above it, builder/optimise/ only core; the entry modules
               (api, cli, main_job, pipeline) are imported by no module below them; a stage module by
               builder/pipeline.py alone (stages/base.py and stages/common.py are shared)
  stages       stages/ modules do not import each other (stages/base.py and stages/common.py excepted)
  subprocess   subprocess.Popen / subprocess.run only in builder/core/processes.py
  tritonclient tritonclient imported only in builder/serving/client.py (Triton's model-config schema,
               tritonclient.grpc.model_config_pb2, excepted: it checks config text, it talks no protocol)
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "builder"
MAX_LINES = 500
SHARED_STAGE_MODULES = {"builder.stages.base", "builder.stages.common", "builder.stages"}
PROCESS_MODULE = "builder.core.processes"
#: folder -> the folders its modules may import from (besides its own)
FLOOR_LIMITS = {"builder.core": (), "builder.optimise": ("builder.core",)}
ENTRY_MODULES = ("builder.api", "builder.cli", "builder.main_job", "builder.pipeline", "builder.__main__")
PACKAGE_FACE = "builder"  # builder/__init__.py: the public names, loaded from builder.api on first use
CLIENT_MODULE = "builder.serving.client"


def modules(root: Path) -> dict[str, Path]:
    """builder module name -> file, skipping the asset symlinks (builder/_assets)."""
    found = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        rel = path.relative_to(root)
        if "_assets" in rel.parts or "__pycache__" in rel.parts:
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _resolve(name: str, module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(tree: ast.Module, module: str, is_package: bool, known: set[str], top_level_only: bool) -> set[str]:
    """The builder modules ``module`` imports (at module level only, when asked; ``if TYPE_CHECKING``
    blocks never count)."""
    def walk(nodes):
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and top_level_only:
                continue
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                yield node
            yield from walk(ast.iter_child_nodes(node))

    found = set()
    for node in walk(tree.body):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            base = _resolve(node.module or "", module, node, is_package)
            names = [f"{base}.{alias.name}" for alias in node.names] + [base]
        for name in names:
            while name and name not in known:  # builder.x.y.func -> builder.x.y
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    # importing builder.a.b runs builder/a/__init__.py too, but that is not a dependency of interest
    return {n for n in found if n.startswith(PACKAGE)}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, result, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                result.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return result


def parsed(root: Path) -> tuple[dict[str, Path], dict[str, list[str]], dict[str, ast.Module]]:
    """builder's modules (name -> file), their source lines and their syntax trees, each file read once."""
    mods = modules(root)
    sources = {m: p.read_text().splitlines() for m, p in mods.items()}
    return mods, sources, {m: ast.parse("\n".join(sources[m]), str(p)) for m, p in mods.items()}


def check(root: Path = ROOT, rules: set[str] | None = None, loaded: tuple | None = None) -> dict[str, list[str]]:
    """{rule: [violation, ...]} for the rules asked for (all by default); ``loaded``: ``parsed(root)`` when the
    caller has it already."""
    mods, sources, trees = loaded or parsed(root)
    known = set(mods)
    rel = {m: str(p.relative_to(root)) for m, p in mods.items()}
    out: dict[str, list[str]] = {name: [] for name in RULES}

    for m in mods:
        lines = len(sources[m])
        if lines > MAX_LINES:
            out["size"].append(f"{rel[m]}: {lines} lines (max {MAX_LINES})")
        text = "\n".join(sources[m])
        if "Path(__file__).resolve().parents[" in text or "Path(__file__).parents[" in text:
            out["parents"].append(f"{rel[m]}: Path(__file__)...parents[N] asset lookup (use builder/core/assets.py)")

    graph = {m: imports(trees[m], m, mods[m].name == "__init__.py", known, top_level_only=False) for m in mods}
    # a package's __init__ importing its own submodules is how a package exposes them, not a circle
    graph = {m: {d for d in deps if not (mods[m].name == "__init__.py" and d.startswith(m + "."))}
             for m, deps in graph.items()}
    for component in find_cycles(graph):
        out["cycles"].append("import circle: " + " <-> ".join(component))

    for m, line, reason in deferred_imports(trees, sources):
        if not reason.startswith("deferred:"):
            out["deferred"].append(f"{rel[m]}:{line}: a builder import inside a function without a "
                                   "'# deferred: <why>' comment (move it to the top of the module)")

    for m, deps in graph.items():
        for dep in sorted(deps):
            problem = floor_problem(m, dep)
            if problem:
                out["floors"].append(f"{rel[m]}: imports {dep} ({problem})")

    for m in mods:
        if not m.startswith("builder.stages.") or m in SHARED_STAGE_MODULES:
            continue
        every = imports(trees[m], m, False, known, top_level_only=False)
        for dep in sorted(every):
            if dep.startswith("builder.stages") and dep not in SHARED_STAGE_MODULES:
                out["stages"].append(f"{rel[m]}: imports {dep} (shared helpers go to builder/stages/common.py)")

    for m, tree in trees.items():
        for node in ast.walk(tree):
            if m != PROCESS_MODULE and isinstance(node, ast.Attribute) and node.attr in ("Popen", "run") \
                    and isinstance(node.value, ast.Name) and node.value.id == "subprocess":
                out["subprocess"].append(f"{rel[m]}:{node.lineno}: subprocess.{node.attr} "
                                         f"(processes start in {PROCESS_MODULE})")
            if m != PROCESS_MODULE and isinstance(node, ast.ImportFrom) and node.module == "subprocess" \
                    and any(a.name in ("Popen", "run") for a in node.names):
                out["subprocess"].append(f"{rel[m]}:{node.lineno}: from subprocess import "
                                         f"{', '.join(a.name for a in node.names)}")
            if m != CLIENT_MODULE and isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                if node_is_triton_client(node, names):
                    out["tritonclient"].append(f"{rel[m]}:{node.lineno}: imports tritonclient "
                                               f"(the Triton protocol goes through {CLIENT_MODULE})")
    return {k: v for k, v in out.items() if rules is None or k in rules}


def _within(module: str, folder: str) -> bool:
    return module == folder or module.startswith(folder + ".")


def floor_problem(module: str, dep: str) -> str | None:
    """Why ``module`` may not import ``dep`` (None: it may)."""
    for folder, allowed in FLOOR_LIMITS.items():
        if _within(module, folder) and not _within(dep, folder) and not any(_within(dep, a) for a in allowed):
            return f"{folder} stands below it: it may import only {', '.join((folder,) + allowed)}"
    if any(_within(dep, e) for e in ENTRY_MODULES) and module != PACKAGE_FACE \
            and not any(_within(module, e) for e in ENTRY_MODULES):
        return "an entry module: only the entry floor (api, cli, main_job, pipeline) imports it"
    if dep.startswith("builder.stages.") and dep not in SHARED_STAGE_MODULES and module != "builder.pipeline" \
            and not module.startswith("builder.stages."):
        return "a stage: only builder/pipeline.py runs stages; shared pieces go to a folder below"
    return None


def deferred_imports(trees: dict[str, ast.Module], sources: dict[str, list[str]]) -> list[tuple[str, int, str]]:
    """(module, line, the comment on that line) of every import of a builder module inside a function."""
    found = []
    for m, tree in trees.items():
        lines = sources[m]
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom) and not node.level:
                    names = [node.module or ""]
                elif isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                else:
                    continue
                if not any(n.split(".")[0] == PACKAGE for n in names):
                    continue
                text = lines[node.lineno - 1] if node.lineno <= len(lines) else ""
                found.append((m, node.lineno, text.partition("#")[2].strip()))
    return sorted(set(found))


def node_is_triton_client(node: ast.AST, names: list[str]) -> bool:
    """An import of tritonclient other than Triton's model-config schema (model_config_pb2, used to
    check config.pbtxt text): that is a schema, not the protocol."""
    if not any(n == "tritonclient" or n.startswith("tritonclient.") for n in names):
        return False
    imported = [a.name for a in node.names]
    return not (isinstance(node, ast.ImportFrom) and imported == ["model_config_pb2"])


RULES = ("size", "parents", "cycles", "deferred", "floors", "stages", "subprocess", "tritonclient")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rule", action="append", choices=RULES, help="check only this rule (repeatable)")
    parser.add_argument("--list", action="store_true", help="list the rules and exit")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout (default: this one)")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(RULES))
        return 0
    failed = 0
    loaded = parsed(args.root)
    results = check(args.root, set(args.rule) if args.rule else None, loaded)
    mods, sources, trees = loaded
    deferred = deferred_imports(trees, sources)
    print(f"deferred imports of builder modules: {len(deferred)}")
    for m, line, reason in deferred:
        print(f"  {mods[m].relative_to(args.root)}:{line}: {reason or '(no reason given)'}")
    for rule, problems in results.items():
        print(f"{rule}: {'ok' if not problems else f'{len(problems)} violation(s)'}")
        for problem in problems:
            print(f"  {problem}")
        failed += len(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
