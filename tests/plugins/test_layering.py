"""The layering rules of the plugin API, read from the source (no imports executed):

- no plugin module imports ``octavo.core`` (the built-ins need nothing a third-party plugin cannot have);
- no SDK module imports ``octavo.core`` except the front ends that drive the engine (``LLM``, ``LLMEngine``,
  ``AsyncLLM``, their shared front end, the server, the CLI), ``octavo.registry`` (the public door to the
  plugin manager) and ``octavo.testing.model`` (it loads checkpoints through the loader, as a front end does);
- no import circle between octavo modules, lazy (function-level) imports included, ``TYPE_CHECKING``
  blocks excluded (never executed);
- no file in ``core/`` over 400 lines;
- no ``core/`` or SDK module imports a vendor kernel language (Triton): device kernels live in the platform plugins
  and the core and SDK reach them through the ``Platform`` object (``make_fused_sampler``, ``make_lora_kernels``, ...).
"""

import ast
import itertools
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = {"sdk": "octavo", "core": "octavo.core", "plugins": "octavo.plugins"}
SDK_FRONT_ENDS = ("octavo.llm", "octavo.llm_engine", "octavo.async_llm", "octavo.frontend", "octavo.server",
                  "octavo.cli", "octavo.registry", "octavo.testing.model")
MAX_CORE_LINES = 400


def _module_name(path: pathlib.Path) -> str:
    top = path.relative_to(ROOT).parts[0]
    parts = [p for p in path.relative_to(ROOT / top).with_suffix("").parts if p != "__init__"]
    return ".".join([PACKAGES[top], *parts])


MODULES = {_module_name(p): p for top in PACKAGES for p in (ROOT / top).rglob("*.py")
           if "__pycache__" not in p.parts}


def _imports(name: str, path: pathlib.Path) -> set[str]:
    """Every module ``name`` imports, at any level, outside ``if TYPE_CHECKING:`` blocks."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            node.body = []
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = name.split(".")[: len(name.split(".")) - node.level + (path.name == "__init__.py")]
                module = ".".join(base + ([module] if module else []))
            out |= {module} | {f"{module}.{a.name}" for a in node.names}
    return out


IMPORTS = {name: _imports(name, path) for name, path in MODULES.items()}


def _core_imports(name: str) -> list[str]:
    return sorted(i for i in IMPORTS[name] if i == "octavo.core" or i.startswith("octavo.core."))


def _under(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_no_plugin_imports_core():
    offenders = {n: _core_imports(n) for n in MODULES if n.startswith("octavo.plugins") and _core_imports(n)}
    assert not offenders, f"plugins import octavo.core (use the public octavo package): {offenders}"


VENDOR_KERNEL_PACKAGES = ("triton",)


def test_core_imports_no_vendor_kernels():
    offenders = {n: sorted(i for i in IMPORTS[n] if i.split(".")[0] in VENDOR_KERNEL_PACKAGES)
                 for n in MODULES if _under(n, ["octavo.core"])}
    offenders = {n: i for n, i in offenders.items() if i}
    assert not offenders, f"core modules import device kernels (put them in a platform plugin): {offenders}"


def test_sdk_imports_no_vendor_kernels():
    """The public package reaches device kernels through the ``Platform`` object too (``make_lora_kernels``...)."""
    offenders = {n: sorted(i for i in IMPORTS[n] if i.split(".")[0] in VENDOR_KERNEL_PACKAGES)
                 for n in MODULES if not _under(n, ["octavo.core", "octavo.plugins"])}
    offenders = {n: i for n, i in offenders.items() if i}
    assert not offenders, f"SDK modules import device kernels (put them in a platform plugin): {offenders}"


def test_sdk_imports_core_only_in_front_ends():
    offenders = {n: _core_imports(n) for n in MODULES
                 if _under(n, ["octavo"]) and not _under(n, ["octavo.core", "octavo.plugins"])
                 and not _under(n, SDK_FRONT_ENDS) and _core_imports(n)}
    assert not offenders, f"SDK modules import octavo.core outside the front ends: {offenders}"


def _graph() -> dict[str, set[str]]:
    graph = {}
    for name, imported in IMPORTS.items():
        deps = set()
        for module in imported:
            while module and module not in MODULES:
                module = module.rpartition(".")[0]
            if module and module != name:
                deps.add(module)
        graph[name] = deps
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = itertools.count()
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = next(counter)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = next(counter)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[v] = min(low[v], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_no_import_circle():
    assert _cycles(_graph()) == []


def test_the_cycle_check_can_fail():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("path", sorted((ROOT / "core").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_core_files_stay_small(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_CORE_LINES, f"{path.relative_to(ROOT)} has {lines} lines; split it (one job per file)"
