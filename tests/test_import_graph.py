"""The import graph of the shardspec package keeps its layering: every module is read with ast (nothing is
imported), and its imports, those inside functions too, must follow :data:`LAYERS`, form no cycle, and stay
at the top of the module unless a comment beside them says why not."""

import ast
import dataclasses
import pathlib

import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]

# The layering, declared here and nowhere else: each part of the package (a module, or a package with every
# module below it) and the parts it may import; a module belongs to the part of its longest prefix. Read
# bottom-up: the spec and the Communicator, the reference, the production implementation and the goldens;
# then the suite: the leaves every part may share, what is checked (judge), what is run (cases), how ranks
# run (harness, handed the judge as an object), the reports, one case run with the judge in this process
# (replay), then the three products: the run, the upstream checks and the command line and plugin.
LAYERS: dict[str, tuple[tuple[str, ...], frozenset[str]]] = {
    "core": (("shardspec",), frozenset()),  # src/shardspec: the Communicator, the engine's step
    "spec": (("shardspec.spec",), frozenset()),
    "reference": (("shardspec.reference",), frozenset({"core", "spec"})),
    "impl": (("shardspec.impl",), frozenset({"core", "spec"})),  # neither the reference nor the suite
    "fixtures": (("shardspec.fixtures",), frozenset({"core", "spec", "reference"})),  # the goldens: no suite
    "suite": (("shardspec.conformance",), frozenset()),  # the package's own __init__
    "usage": (("shardspec.conformance.usage",), frozenset()),  # the usage error and bounds, imported by all
    "output_paths": (("shardspec.conformance.output_paths",), frozenset()),
    "record": (("shardspec.conformance.record",), frozenset({"spec"})),  # what crosses from a rank to the judge
    "api": (("shardspec.conformance.api",), frozenset({"spec"})),  # how an implementation is found
    "judge": (("shardspec.conformance.judge",), frozenset({"record", "spec", "reference"})),
    "cases": (("shardspec.conformance.cases",), frozenset({"record", "spec", "usage"})),
    "harness": (("shardspec.conformance.harness",), frozenset({"api", "core", "record", "reference", "spec"})),
    "broken": (("shardspec.conformance.broken",), frozenset({"cases", "core", "reference", "spec"})),
    "report": (("shardspec.conformance.report",), frozenset({"cases", "core", "output_paths", "record", "spec"})),
    "replay": (
        ("shardspec.conformance.replay",),
        frozenset({"api", "cases", "core", "fixtures", "harness", "judge", "record", "spec"}),
    ),
    "run": (
        ("shardspec.conformance.run",),
        frozenset(
            {
                "api",
                "cases",
                "fixtures",
                "harness",
                "judge",
                "output_paths",
                "record",
                "replay",
                "report",
                "spec",
                "usage",
            }
        ),
    ),
    "upstream": (
        ("shardspec.conformance.upstream",),
        frozenset({"api", "cases", "harness", "judge", "replay", "spec"}),
    ),
    "entry": (
        (
            "shardspec.conformance.__main__",
            "shardspec.conformance.cli",
            "shardspec.conformance.plugin",
            "shardspec.conformance.test_conformance",
        ),
        frozenset({"core", "output_paths", "report", "run", "upstream", "usage"}),
    ),
}
# Imports inside functions, in the whole package: each one an optional dependency (pytest, hypothesis, jinja2,
# triton, an adapter on a path set at run time) or a module kept out of a process that must stay light (the
# pytest plugin's, the drift check's), with its reason beside it.
MAX_INNER_IMPORTS = 14  # those left today (each with its reason): a new one must say why and raise this


@dataclasses.dataclass(frozen=True)
class Import:
    module: str  # the importing module
    target: str  # the imported module of the package
    line: int
    inner: bool  # inside a function
    type_checking: bool  # under ``if TYPE_CHECKING:``


def _modules() -> dict[str, pathlib.Path]:
    """Every module of the package by its dotted name (a package by its own)."""
    folders = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    found = {}
    for package, folder in folders.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            found.setdefault(".".join((package, *parts)), path)
    return found


MODULES = _modules()


def _targets(module: str, path: pathlib.Path, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The package's modules ``node`` imports (``from package import module`` names the module)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            parts = module.split(".")
            parts = parts if path.name == "__init__.py" else parts[:-1]
            base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
    found = []
    for name in names:
        while name not in MODULES and "." in name:
            name = name.rsplit(".", 1)[0]
        if name in MODULES and name != module:
            found.append(name)
    return found


def _imports_of(module: str, path: pathlib.Path) -> list[Import]:
    found: list[Import] = []

    def visit(node: ast.AST, inner: bool, type_checking: bool) -> None:
        if isinstance(node, ast.Import | ast.ImportFrom):
            targets = _targets(module, path, node) or ["<outside>"]
            found.extend(Import(module, t, node.lineno, inner, type_checking) for t in targets)
            return
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                visit(child, inner, True)
            for child in node.orelse:
                visit(child, inner, type_checking)
            return
        inner = inner or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        for child in ast.iter_child_nodes(node):
            visit(child, inner, type_checking)

    visit(ast.parse(path.read_text(), filename=str(path)), False, False)
    return found


IMPORTS = [imp for module, path in MODULES.items() for imp in _imports_of(module, path)]


def _part(module: str) -> str:
    """The part of LAYERS with the longest prefix of ``module``."""
    lengths = {name: _longest(module, prefixes) for name, (prefixes, _) in LAYERS.items()}
    best = max(lengths, key=lengths.__getitem__)
    assert lengths[best], f"{module} is in no part of LAYERS"
    return best


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return _longest(module, prefixes) > 0


def _longest(module: str, prefixes: tuple[str, ...]) -> int:
    return max((len(p) for p in prefixes if module == p or module.startswith(p + ".")), default=0)


def _cycles(edges: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def test_every_module_is_in_one_part_of_the_layering():
    for module in MODULES:
        _part(module)


def test_no_import_cycle_counting_imports_inside_functions():
    edges: dict[str, set[str]] = {module: set() for module in MODULES}
    for imp in IMPORTS:
        if imp.target in MODULES and not imp.type_checking:
            edges[imp.module].add(imp.target)
    cycles = _cycles(edges)
    found = [sorted(cycle) for cycle in cycles]
    assert not found, f"import cycles (break each by moving what its modules share into a lower module): {found}"


def test_every_import_follows_the_layering():
    offenders = []
    for imp in IMPORTS:
        if imp.target not in MODULES:
            continue
        importer, imported = _part(imp.module), _part(imp.target)
        if importer != imported and imported not in LAYERS[importer][1]:
            offenders.append(f"{imp.module}:{imp.line} ({importer}) imports {imp.target} ({imported})")
    assert not offenders, "\n".join(offenders)


def _inner_statements() -> list[Import]:
    """One per import statement inside a function (not under TYPE_CHECKING)."""
    seen, found = set(), []
    for imp in IMPORTS:
        if imp.inner and not imp.type_checking and (imp.module, imp.line) not in seen:
            seen.add((imp.module, imp.line))
            found.append(imp)
    return found


def test_imports_inside_functions_are_few():
    inner = _inner_statements()
    assert len(inner) <= MAX_INNER_IMPORTS, "\n".join(f"{imp.module}:{imp.line}" for imp in inner)


def test_an_import_inside_a_function_says_why_beside_it():
    """A comment on its line or the line before: the optional dependency, or the process kept light."""
    unexplained = []
    for imp in _inner_statements():
        lines = MODULES[imp.module].read_text().splitlines()
        here, before = lines[imp.line - 1], lines[imp.line - 2].strip() if imp.line > 1 else ""
        if "#" not in here and not before.startswith("#"):
            unexplained.append(f"{imp.module}:{imp.line}: {here.strip()}")
    assert not unexplained, "\n".join(unexplained)
