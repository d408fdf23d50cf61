"""The layout a reader can walk: features that never import each other, thin handlers, one error
root that the state machines' Retry/Catch names match, product code apart from development code."""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import json
import pkgutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import hpops_core
from hpops_core.common.errors import HpopsError
from hpops_twin.template_model import REPO_ROOT, TemplateModel

CORE = REPO_ROOT / "layers" / "hpops_core" / "hpops_core"
FEATURES = {"login_sync", "host_identity", "session_limits", "budget_guard"}
# What features share, and what each shared package may itself use.
SHARED = {"common": {"common"}, "cluster": {"common", "cluster"}, "node_channel": {"common", "cluster", "node_channel"}}
# functions/<folder> -> the package its handlers are thin over
FUNCTION_FOLDERS = {"login_node_sync": "login_sync", "host_identity": "host_identity",
                    "session_limits": "session_limits", "budget_guard": "budget_guard", "node_reports": "node_channel"}
PRODUCT_ROOTS = ("layers", "functions", "cli", "node")
DEVELOPMENT_ONLY = {"moto", "pytest", "hpops_twin", "tests", "fake_session_directory", "real_tools", "yaml"}
HANDLER_MAX_LINES = 40
SOURCE_SUFFIXES = (".py", ".json", ".yaml", ".sh", ".md", ".toml", ".service")


def imported_modules(path: Path) -> set[str]:
    """Every absolute module a file imports, at the top or inside a function (lazy imports count)."""
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


# Where import names start: each tree's packages, and each Lambda code folder (its handlers are
# top-level modules there, named functions.<folder>.<module> here so two folders' app.py differ).
IMPORT_ROOTS = ("layers/hpops_core", "cli", "node", "twin")


def module_files(roots: list[tuple[Path, str]]) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under each (folder, name prefix)."""
    found = {}
    for folder, prefix in roots:
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if ".venv" in parts or "build" in parts:
                continue
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            found[".".join([prefix, *parts] if prefix else parts)] = path
    return found


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of ``modules`` it imports: at the top, inside functions (lazy) and under
    TYPE_CHECKING alike, since each is a dependency a reader follows; relative imports resolved."""
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        prefix = name.rpartition(".")[0] + "." if name.startswith("functions.") else ""
        wanted = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                wanted |= {(alias.name,) for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join([*package.split(".")[:len(package.split(".")) - node.level + 1], *filter(None, [base])])
                wanted |= {(f"{base}.{alias.name}", base) for alias in node.names}
        edges = set()
        for candidates in wanted:
            for candidate in candidates:
                parts = candidate.split(".")
                while parts and ".".join(parts) not in modules and prefix + ".".join(parts) not in modules:
                    parts.pop()
                if parts:
                    dotted = ".".join(parts)
                    edges.add(dotted if dotted in modules else prefix + dotted)
                    break
        graph[name] = edges - {name}
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected group of modules (Tarjan), as a path from its first module
    back to itself: what a reader would follow round."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for used in sorted(graph.get(module, ())):
            if used not in index:
                visit(used)
                low[module] = min(low[module], low[used])
            elif used in on_stack:
                low[module] = min(low[module], index[used])
        if low[module] == index[module]:
            group = set()
            while not group or member != module:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
            if len(group) > 1:
                groups.append(group)

    for module in sorted(graph):
        if module not in index:
            visit(module)
    circles = []
    for group in groups:
        start = min(group)
        paths = {start: [start]}
        queue = [start]
        while queue:  # the shortest way round from start, inside the group
            module = queue.pop(0)
            for used in sorted(graph[module] & group):
                if used == start:
                    circles.append(paths[module] + [start])
                    queue = []
                    break
                if used not in paths:
                    paths[used] = paths[module] + [used]
                    queue.append(used)
    return sorted(circles)


def repository_modules() -> dict[str, Path]:
    roots = [(REPO_ROOT / root, "") for root in IMPORT_ROOTS]
    roots += [(folder, f"functions.{folder.name}") for folder in sorted((REPO_ROOT / "functions").iterdir()) if folder.is_dir()]
    return module_files(roots)


def core_packages_used(path: Path) -> set[str]:
    return {name.split(".")[1] for name in imported_modules(path)
            if name.startswith("hpops_core.") and name.count(".") >= 1}


def py_files(*roots: Path) -> list[Path]:
    return sorted(p for root in roots for p in root.rglob("*.py"))


@pytest.mark.parametrize("package", sorted(FEATURES | set(SHARED)))
def test_no_feature_imports_another_feature(package):
    allowed = {package} | set(SHARED) if package in FEATURES else SHARED[package]
    offenders = {f"{p.relative_to(REPO_ROOT)} -> hpops_core.{used}"
                 for p in py_files(CORE / package) for used in core_packages_used(p) - allowed}
    assert not offenders


@pytest.mark.parametrize("folder", sorted(FUNCTION_FOLDERS))
def test_handlers_use_only_their_feature_and_what_is_shared(folder):
    allowed = {FUNCTION_FOLDERS[folder]} | set(SHARED)
    offenders = {f"{p.relative_to(REPO_ROOT)} -> hpops_core.{used}"
                 for p in py_files(REPO_ROOT / "functions" / folder) for used in core_packages_used(p) - allowed}
    assert not offenders


def test_every_core_package_is_a_feature_or_shared():
    packages = {p.name for p in CORE.iterdir() if (p / "__init__.py").exists()}
    assert packages == FEATURES | set(SHARED)
    assert not [p.name for p in CORE.glob("*.py") if p.name != "__init__.py"], "loose modules belong in a package"


def test_no_import_circles_in_product_cli_or_twin():
    modules = repository_modules()
    assert {"hpops.main", "hpops_twin.world", "hpops_core.session_limits.config", "functions.login_node_sync.app"} <= set(modules)
    circles = import_circles(import_graph(modules))
    assert not circles, "import circles:\n" + "\n".join(" -> ".join(circle) for circle in circles)


def test_the_circle_check_names_a_circle_it_is_given():
    graph = {"a": {"b"}, "b": {"c", "d"}, "c": {"a"}, "d": set(), "e": {"e2"}, "e2": {"e"}, "f": {"a"}}
    assert import_circles(graph) == [["a", "b", "c", "a"], ["e", "e2", "e"]]
    assert import_circles({"a": {"b"}, "b": set()}) == []


def test_the_circle_check_finds_a_circle_through_lazy_and_type_checking_imports(tmp_path):
    """The shapes the repository had: a relative import one way, a TYPE_CHECKING or in-function import back."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "config.py").write_text("def load():\n    from .limits import text\n    return text()\n")
    (package / "limits.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.config import load\n"
                                       "def text():\n    return ''\n")
    (package / "alone.py").write_text("import pkg.limits\nfrom pkg import config\n")
    graph = import_graph(module_files([(tmp_path, "")]))
    assert graph["pkg.alone"] == {"pkg.limits", "pkg.config"}
    assert import_circles(graph) == [["pkg.config", "pkg.limits", "pkg.config"]]
    (package / "limits.py").write_text("def text():\n    return ''\n")  # untangled: one direction
    assert import_circles(import_graph(module_files([(tmp_path, "")]))) == []


def test_product_code_never_imports_development_code():
    offenders = set()
    for path in py_files(*(REPO_ROOT / root for root in PRODUCT_ROOTS)):
        for name in imported_modules(path):
            if name.split(".")[0] in DEVELOPMENT_ONLY:
                offenders.add(f"{path.relative_to(REPO_ROOT)} -> {name}")
    # `hpops demo|bench|twin|--twin` finds the twin through its entry point, never an import.
    assert not offenders


def test_tests_folder_holds_tests_and_their_doubles_only():
    # unit_sandbox.py: a systemd unit's file-system sandbox rebuilt for the agent's tests (no systemd here).
    # unit_seccomp.py: that unit's system-call settings, a seccomp filter loaded before the agent starts.
    # channel_stand_in.py: NodeChannel's Invoke API on loopback for real-process agents (checks their signatures).
    # xdist_group_probe.py: tests run only by test_suite_layout.py's own pytest, to see which worker each went to.
    # nested_run_probe.py: a test run only by test_suite_record.py's own pytest, that runs pytest inside it.
    allowed_helpers = {"conftest.py", "fake_session_directory.py", "real_tools.py", "operator_policy.py", "__init__.py",
                       "unit_sandbox.py", "unit_seccomp.py", "channel_stand_in.py",
                       "xdist_group_probe.py", "nested_run_probe.py"}
    strays = [p.relative_to(REPO_ROOT) for p in (REPO_ROOT / "tests").rglob("*.py")
              if not p.name.startswith("test_") and p.name not in allowed_helpers]
    assert not strays


def _handler_functions():
    for spec in TemplateModel().functions().values():
        module, function = spec.handler.rsplit(".", 1)
        yield spec.logical_id, spec.code_uri / f"{module}.py", function


@pytest.mark.parametrize("logical_id,path,function", list(_handler_functions()), ids=lambda v: str(v).rsplit("/")[-1])
def test_handlers_are_thin(logical_id, path, function):
    tree = ast.parse(path.read_text())
    [node] = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function]
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    length = node.end_lineno - first + 1
    assert length <= HANDLER_MAX_LINES, f"{logical_id}: {path.name}:{function} is {length} lines"


@pytest.mark.parametrize("logical_id,path,function", list(_handler_functions()), ids=lambda v: str(v).rsplit("/")[-1])
def test_handlers_set_up_observability_before_other_core_modules(logical_id, path, function):
    # Measured: a handler that imports a boto3-using core module before handler_tools (which loads
    # Powertools and patches botocore for X-Ray) imports 50-140 ms slower on a cold start.
    tree = ast.parse(path.read_text())
    core = [n.module for n in tree.body if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("hpops_core")]
    assert not core or core[0] == "hpops_core.common.observability", f"{logical_id}: {path.name} imports {core[0]} first"


def test_no_sleep_in_lambda_code():
    # Waiting belongs in the state machine (an ASL Wait loop with its bound in the ASL), never in a
    # Lambda that is billed while it sleeps and can time out mid-wait.
    offenders = []
    for path in py_files(REPO_ROOT / "layers", REPO_ROOT / "functions"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if name == "sleep":
                    offenders.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno}")
    assert not offenders


def _core_exception_classes() -> dict[str, type]:
    classes = {}
    for info in pkgutil.walk_packages(hpops_core.__path__, "hpops_core."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == info.name:
                classes[name] = value
    return classes


def _function_exception_classes() -> dict[str, list[str]]:
    """Exception classes defined in handler modules: name -> base names (read from the source)."""
    found = {}
    for path in py_files(REPO_ROOT / "functions"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                bases = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases]
                found[node.name] = bases
    return found


def test_one_error_root():
    core = _core_exception_classes()
    assert len(core) > 20
    strays = sorted(name for name, cls in core.items() if not issubclass(cls, HpopsError))
    assert not strays, f"exceptions outside the HpopsError root: {strays}"
    builtin = {name for name, value in vars(builtins).items() if inspect.isclass(value) and issubclass(value, BaseException)}
    for name, bases in _function_exception_classes().items():
        assert not set(bases) & builtin, f"functions/: {name}({', '.join(bases)}) is outside the root"
        assert all(issubclass(core[b], HpopsError) for b in bases if b in core)


def test_every_error_name_a_state_machine_handles_is_one_we_raise():
    core = _core_exception_classes()
    ours = set(core) | {name for name, bases in _function_exception_classes().items() if set(bases) & set(core)}
    aws_prefixes = ("States.", "Lambda.", "Sandbox.")
    for spec in TemplateModel().state_machines().values():
        text = spec.definition_path.read_text()
        names = set()

        def collect(value):
            if isinstance(value, dict):
                for key, inner in value.items():
                    if key == "ErrorEquals":
                        names.update(inner)
                    collect(inner)
            elif isinstance(value, list):
                for inner in value:
                    collect(inner)

        collect(json.loads(text))
        unknown = sorted(n for n in names if not n.startswith(aws_prefixes) and n not in ours)
        assert not unknown, f"{spec.definition_path.name} handles errors nothing raises: {unknown}"


def test_the_operator_install_carries_no_development_code(tmp_path):
    """`pip install .` is the operator's CLI: hpops, the Lambda code it shares, the node agent and its
    lifecycle files; no twin, no tests, no moto."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path), str(REPO_ROOT)], check=True, capture_output=True, timeout=300)
    [wheel] = tmp_path.glob("hpops-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    packages = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert packages == {"hpops", "hpops_core", "hpops_node_agent"}
    assert "hpops_node_agent/lifecycle/install.sh" in names
    assert "hpops_node_agent/lifecycle/hpops-node-agent.service" in names
    requirements = [line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    runtime = [r for r in requirements if "extra ==" not in r]
    assert not [r for r in runtime if r.lower().startswith(("moto", "pytest", "pyyaml", "aws-sam-cli"))]
    assert not [r for r in requirements if r.lower().startswith("moto")]


def test_twin_commands_say_how_to_get_the_twin_when_it_is_not_installed(capsys, monkeypatch):
    from hpops import main as cli

    monkeypatch.setitem(sys.modules, "hpops_twin", None)  # as in an operator's `pip install .`
    for loaded in [name for name in sys.modules if name.startswith("hpops_twin.")]:
        monkeypatch.delitem(sys.modules, loaded)  # an earlier test's import must not stand in for the twin
    assert cli.main(["demo"]) == 2
    assert "pip install -e ./twin" in capsys.readouterr().out


def test_every_repository_path_the_readme_names_exists():
    text = (REPO_ROOT / "README.md").read_text()
    tree = text[text.index("## Where things are"):]
    tree = tree[tree.index("```") + 3:]
    tree = tree[:tree.index("```")]
    named = {line.split()[0] for line in tree.splitlines() if line.strip()}
    named |= set(__import__("re").findall(r"`([A-Za-z0-9_.-]+/[A-Za-z0-9_./-]*)`", text))
    files = [p.relative_to(REPO_ROOT).as_posix() for p in REPO_ROOT.rglob("*")
             if ".venv" not in p.parts and ".git" not in p.parts]
    top_level = {p.name for p in REPO_ROOT.iterdir()} | {"hpops_core", "hpops_twin", "hpops_node_agent", "hpops"}
    missing = []
    for name in sorted(named):
        looks_like_ours = name.split("/")[0] in top_level or name.endswith(SOURCE_SUFFIXES)
        if "<" in name or not looks_like_ours:
            continue
        bare = name.rstrip("/")
        if not (REPO_ROOT / bare).exists() and not any(f == bare or f.endswith("/" + bare) for f in files):
            missing.append(name)
    assert not missing, f"README names paths that do not exist: {missing}"
