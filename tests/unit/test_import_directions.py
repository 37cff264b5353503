"""Imports flow one way (DEVELOPERS.md, "Import rules"): read from every module's source
with ``ast``, imports inside functions included, so a lazy import breaks a rule as surely
as one at the top of a file."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import p2ptrain

PACKAGE_DIR = Path(p2ptrain.__file__).parent

HEAVY = {"torch", "hivemind", "transformers", "peft", "bitsandbytes"}
# Modules that import nothing of p2ptrain but each other: anything may use them.
LEAVES = {"config", "paths", "protocol", "control_types", "worker_pipe", "pipe_codec", "multiaddr", "processes", "durations",
          "openmetrics", "swarm_metrics", "http_endpoint"}
# Every part of p2ptrain (a subpackage or a top-level module), so a new one must be placed here.
PARTS = LEAVES | {"p2ptrain", "cli", "tui", "daemon", "peers", "storage", "service", "demo", "monitor"}
# What each part must never import.
FORBIDDEN = {
    # the CLI and TUI start fast; the pipe module is what the daemon and the worker share
    **dict.fromkeys(("cli", "tui", "protocol", "control_types", "paths", "durations", "worker_pipe", "pipe_codec"),
                    HEAVY | {"peers", "storage", "daemon", "monitor"}),
    "peers": {"daemon", "tui", "monitor"},
    "storage": {"peers", "daemon", "tui", "monitor"},
    "daemon": {"tui", "monitor"},
    # a peer of no run's training: the DHT's readers of peers, never the daemon's state or database
    "monitor": {"daemon", "storage", "tui"},
}
# `p2ptrain daemon` runs the daemon in the CLI's process, imported only when typed.
ALLOWED = {
    ("p2ptrain.cli", "cmd_daemon", "p2ptrain.daemon.main"),
}
# The CLI imports a command's module by name, from its table (``MODULE_COMMANDS``), only when that command
# is typed: these are the modules it may import so. The table's imports count like any other for the circles.
COMMAND_MODULES = {"p2ptrain.daemon.plan_command", "p2ptrain.daemon.doctor", "p2ptrain.tui.app", "p2ptrain.peers.model.export",
                   "p2ptrain.monitor.command"}


@dataclass(frozen=True)
class Import:
    importer: str  # p2ptrain.daemon.supervisor
    imported: str  # p2ptrain.worker_pipe, torch.nn...
    function: str | None  # the function it sits in, None at module level
    line: int

    def __str__(self) -> str:
        where = f" (in {self.function})" if self.function else ""
        return f"{self.importer}:{self.line}{where} imports {self.imported}"


def module_name(path: Path, package_dir: Path) -> str:
    parts = path.relative_to(package_dir.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str, package_dir: Path) -> bool:
    relative = Path(*name.split(".")[1:]) if "." in name else Path()
    base = package_dir / relative
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def imports_in(path: Path, package_dir: Path) -> list[Import]:
    """Every import in one file, wherever it sits (``from a import b`` counts as ``a.b`` when ``b`` is a module)."""
    module = module_name(path, package_dir)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []

    def visit(node: ast.AST, function: str | None) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node.name if function is None else f"{function}.{node.name}"
        if isinstance(node, ast.Import):
            found.extend(Import(module, alias.name, function, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                imported = submodule if base.split(".")[0] == package_dir.name and is_module(submodule, package_dir) else base
                found.append(Import(module, imported, function, node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(ast.parse(path.read_text(), filename=str(path)), None)
    return found


def command_table_imports(package_dir: Path) -> list[Import]:
    """The imports the CLI makes by name (``__import__``) from its ``MODULE_COMMANDS`` table, which ``ast`` cannot see as imports."""
    cli = package_dir / "cli.py"
    if not cli.is_file():
        return []
    found = []
    for node in ast.walk(ast.parse(cli.read_text())):
        if isinstance(node, ast.Assign) and any(getattr(target, "id", None) == "MODULE_COMMANDS" for target in node.targets):
            for module, _ in ast.literal_eval(node.value).values():
                found.append(Import(f"{package_dir.name}.cli", module, "MODULE_COMMANDS", node.lineno))
    return found


def all_imports(package_dir: Path = PACKAGE_DIR) -> list[Import]:
    in_files = [found for path in sorted(package_dir.rglob("*.py")) for found in imports_in(path, package_dir)]
    return in_files + command_table_imports(package_dir)


def part_of(module: str, package_name: str = "p2ptrain") -> str:
    """``p2ptrain.daemon.supervisor`` -> ``daemon``; ``p2ptrain`` -> ``p2ptrain``; ``torch.nn`` -> ``torch``."""
    parts = module.split(".")
    if parts[0] != package_name:
        return parts[0]
    return parts[1] if len(parts) > 1 else package_name


def broken_rules(imports: list[Import], package_name: str = "p2ptrain") -> list[str]:
    """One line per import that goes a forbidden way."""
    broken = []
    for found in imports:
        importer, imported = part_of(found.importer, package_name), part_of(found.imported, package_name)
        ours = found.imported.split(".")[0] == package_name
        if (found.importer, found.function, found.imported) in ALLOWED or importer == imported:
            continue
        if found.function == "MODULE_COMMANDS" and found.imported in COMMAND_MODULES:
            continue
        if imported in FORBIDDEN.get(importer, ()):
            broken.append(f"{found}: {importer} must not import {imported}")
        elif importer in LEAVES and ours and imported not in LEAVES:
            broken.append(f"{found}: {importer} is a leaf, it may import only the other leaves ({', '.join(sorted(LEAVES))})")
    return broken


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Groups of nodes that reach each other through ``edges`` (Tarjan's strongly connected components)."""
    index: dict[str, int] = {}
    lowest: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def connect(node: str) -> None:
        index[node] = lowest[node] = len(index)
        stack.append(node)
        for other in sorted(edges.get(node, ())):
            if other not in index:
                connect(other)
                lowest[node] = min(lowest[node], lowest[other])
            elif other in stack:
                lowest[node] = min(lowest[node], index[other])
        if lowest[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            connect(node)
    return found


def cycles_between(imports: list[Import], group_of, package_name: str = "p2ptrain") -> list[list[str]]:
    """Circles between the groups ``group_of(module)`` names (None: left out), through imports anywhere."""
    edges: dict[str, set[str]] = {}
    for found in imports:
        if found.imported.split(".")[0] != package_name or (found.importer, found.function, found.imported) in ALLOWED:
            continue
        importer, imported = group_of(found.importer), group_of(found.imported)
        if importer and imported and importer != imported:
            edges.setdefault(importer, set()).add(imported)
    return cycles(edges)


def package_cycles(imports: list[Import], package_name: str = "p2ptrain") -> list[list[str]]:
    """Parts of p2ptrain that import each other, directly or through others (p2ptrain/__init__ only holds __version__)."""
    return cycles_between(imports, lambda module: (part := part_of(module, package_name)) != package_name and part, package_name)


def peers_package_of(module: str) -> str | None:
    """``p2ptrain.peers.swarm.view`` -> ``swarm``; None outside ``peers``'s sub-packages."""
    parts = module.split(".")
    return parts[2] if parts[:2] == ["p2ptrain", "peers"] and len(parts) > 3 else None


def test_every_part_of_p2ptrain_has_its_place_in_the_rules():
    found = {part_of(module_name(path, PACKAGE_DIR)) for path in PACKAGE_DIR.rglob("*.py")}
    assert found - PARTS == set(), "place the new part in PARTS (and LEAVES or FORBIDDEN) of this test"


def test_no_import_goes_a_forbidden_way():
    assert broken_rules(all_imports()) == []


def test_no_two_packages_import_each_other():
    assert package_cycles(all_imports()) == []


def test_no_two_of_peers_sub_packages_import_each_other():
    assert cycles_between(all_imports(), peers_package_of) == []


def test_no_module_imports_itself_through_others():
    modules = {module_name(path, PACKAGE_DIR) for path in PACKAGE_DIR.rglob("*.py")}
    assert cycles_between(all_imports(), lambda module: module if module in modules else None) == []


def test_the_supervisor_starts_without_torch_or_hivemind():
    code = (
        "import p2ptrain.daemon.supervisor, sys\n"
        "assert 'torch' not in sys.modules and 'hivemind' not in sys.modules, sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'hivemind'})"
    )
    environment = dict(os.environ, PYTHONPATH=str(PACKAGE_DIR.parent))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=environment)
    assert result.returncode == 0, result.stderr[-2000:]


# ----- the rules can fail: the same checks over a small package with bad imports -----


def write_package(root: Path, files: dict[str, str]) -> Path:
    for name, source in files.items():
        path = root / "p2ptrain" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return root / "p2ptrain"


@pytest.mark.parametrize(
    ("files", "complaint"),
    [
        ({"cli.py": "def cmd_status():\n    import torch\n"}, "p2ptrain.cli:2 (in cmd_status) imports torch: cli must not import torch"),
        ({"tui/app.py": "from p2ptrain.daemon import supervisor\n"}, "tui must not import daemon"),
        ({"peers/worker.py": "from ..daemon.calibrate import is_out_of_memory\n"}, "imports p2ptrain.daemon.calibrate: peers must not import daemon"),
        ({"storage/db.py": "from p2ptrain.peers.swarm.view import records\n"}, "storage must not import peers"),
        ({"config.py": "from p2ptrain.daemon.policies import PolicySettings\n"}, "config is a leaf"),
        ({"worker_pipe.py": "import hivemind.utils\n"}, "worker_pipe must not import hivemind"),
    ],
)
def test_a_forbidden_import_is_named_with_its_line(tmp_path, files, complaint):
    package_dir = write_package(tmp_path, {"__init__.py": "", "daemon/__init__.py": "", "peers/__init__.py": "", **files})
    broken = broken_rules(all_imports(package_dir))
    assert len(broken) == 1 and complaint in broken[0], broken


def test_a_cycle_between_packages_is_found(tmp_path):
    package_dir = write_package(tmp_path, {
        "__init__.py": "", "daemon/__init__.py": "", "peers/__init__.py": "",
        "daemon/supervisor.py": "from p2ptrain.peers.worker import OUT_OF_MEMORY_EXIT_CODE\n",
        "peers/worker.py": "def main():\n    from p2ptrain.daemon import calibrate\n",
        "daemon/calibrate.py": "",
    })
    assert package_cycles(all_imports(package_dir)) == [["daemon", "peers"]]


def test_a_circle_between_modules_is_found_through_the_clis_command_table(tmp_path):
    package_dir = write_package(tmp_path, {
        "__init__.py": "", "daemon/__init__.py": "",
        "cli.py": 'MODULE_COMMANDS = {"plan": ("p2ptrain.daemon.plan", "what a device would do")}\n',
        "daemon/plan.py": "def run():\n    from p2ptrain.cli import main\n",
    })
    modules = {"p2ptrain.cli", "p2ptrain.daemon.plan"}
    assert cycles_between(all_imports(package_dir), lambda module: module if module in modules else None) == [sorted(modules)]
    assert broken_rules(all_imports(package_dir)) == [
        "p2ptrain.cli:1 (in MODULE_COMMANDS) imports p2ptrain.daemon.plan: cli must not import daemon"]
