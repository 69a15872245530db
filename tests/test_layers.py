"""The rules of dependency between packages: the arrows point inward.

The scheduler core and the domain never import the store, the web framework, an
executor or the clock's owners; the control loop never imports upkeep, nor upkeep the
loop (the composition root, ``server.py``, hands each what it needs of the other); the
CLI reaches the server only through the client, except ``allot up`` and the local
replay. Every import is checked, those inside functions included. The composition root is
``server.py``, ``host.py`` (the scheduler's side of a server, which may run in a
process of its own) and ``api_processes.py`` (the API served by several processes).
"""

from __future__ import annotations

import ast
from pathlib import Path

import allotment

ROOT = Path(allotment.__file__).parent

ALLOWED: dict[str, set[str]] = {
    "domain": set(),
    "scheduler": {"domain"},
    "telemetry": {"domain"},
    "executors": {"domain"},
    # The read views turn store rows into the scheduler's snapshot value types.
    "store": {"domain", "telemetry", "scheduler.snapshot"},
    "accounting": {"domain", "store"},
    "control": {"domain", "scheduler", "store", "executors", "telemetry"},
    "upkeep": {"domain", "store", "executors", "telemetry"},
    "sim": {"domain", "scheduler"},
    "web": set(),
    # The what-if replays recorded history with the simulator.
    "api": {"domain", "scheduler", "store", "control", "accounting", "web", "sim"},
    "clientconfig": {"domain"},
    "client": {"domain", "clientconfig"},
    "cli": {"client", "clientconfig", "domain", "scheduler", "sim", "server", "web"},
}
"""What each package may import of the others (a dotted entry allows one module)."""


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found.update(n.removeprefix("allotment.") for n in names if n.startswith("allotment."))
    return found


def _allowed(target: str, rules: set[str]) -> bool:
    return any(target == rule or target.startswith(rule + ".") for rule in rules)


def test_every_package_imports_only_what_its_layer_allows() -> None:
    wrong: list[str] = []
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT)
        package = relative.parts[0] if len(relative.parts) > 1 else relative.stem
        if package in ("__init__", "server", "host", "api_processes"):
            continue  # the composition root imports everything
        assert package in ALLOWED, f"{package}: a new package needs its rule here"
        for target in _imports(path):
            if target.split(".")[0] == package:
                continue
            if not _allowed(target, ALLOWED[package]):
                wrong.append(f"{relative} imports allotment.{target}")
    assert not wrong, "\n".join(wrong)


def test_the_rules_are_not_vacuous() -> None:
    """The checker sees imports (a broken parser would pass everything)."""
    assert "domain.cluster" in _imports(ROOT / "scheduler" / "snapshot.py")
