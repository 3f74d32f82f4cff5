"""The package's layering, checked from the source: no import cycles between modules, the
layers import only downwards, and no module uses another module's private names.

Private use is found by name: `from .x import _name`, `x._name` on a module of this tree,
and `obj._name` where `_name` is not defined (assigned, declared in `__slots__`, or a
method) in the module doing the access, so it can only belong to a class of another
module. `self._name` is the class's own or its base's; no class overrides a private
method of a class from another module (drivers are objects a device holds, not
subclasses filling in its hooks). Dunder names are public protocol. Imports
under `if TYPE_CHECKING:` run only for type checkers and make no cycle.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("hal", "vm", "scheduler", "server")
# Standard-library private names used on purpose, each with its reason.
STDLIB_PRIVATE = {
    ("hal.ringbuffer", "_is_owned"): "RLock has no public owner query; Condition uses this",
    ("vm.ops", "_handle"): "ctypes documents CDLL._handle, needed for dlvsym",
    ("server.main", "_exit"): "os._exit: exit without tearing down under running kernels",
    ("vm.run", "_exit"): "os._exit: tinyhal-run leaves without the interpreter's teardown",
}
# which top-level packages each layer may import (besides itself and errors/__init__)
ALLOWED = {
    "scheduler": set(),
    "hal": {"scheduler"},
    "vm": {"hal", "scheduler"},
    "server": {"vm", "hal", "scheduler"},
}


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "native" in path.parts and path.name == "build.py":
                continue
            rel = path.relative_to(ROOT).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(module: str, node: ast.ImportFrom, is_package: bool) -> list[str]:
    """Absolute dotted names (inside this tree) an ImportFrom refers to."""
    if node.level == 0:
        return []
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    target = ".".join(base + ([node.module] if node.module else []))
    names = []
    for alias in node.names:
        candidate = f"{target}.{alias.name}" if target else alias.name
        names.append(candidate if candidate in MODULES else target)
    return names


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _imports(module: str, path: Path, import_time_only: bool = False) -> set[str]:
    """The tree's modules `module` imports; with `import_time_only`, only the imports
    that run when it is imported (not inside functions, not for type checkers): what
    makes a cycle."""
    tree = _parse(path)
    if import_time_only:
        nodes = []
        for node in tree.body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            nodes.extend(ast.walk(node) if isinstance(node, ast.If | ast.Try) else [node])
    else:
        nodes = list(ast.walk(tree))
    is_package = path.name == "__init__.py"
    out = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom):
            for name in _resolve(module, node, is_package):
                if name in MODULES and name != module:
                    out.add(name)
    return out


def test_no_two_modules_import_each_other_and_no_cycles():
    graph = {m: {d for d in _imports(m, p, import_time_only=True) if not m.startswith(d + ".")}
             for m, p in MODULES.items()}
    # A package's __init__ importing its own submodules is how it re-exports them; a
    # submodule importing its package's __init__ is what would close a cycle.
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                cycles.append(stack[stack.index(dep):] + [dep] if dep in stack else [node, dep])
            elif dep not in state:
                visit(dep, stack + [dep])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles, cycles


@pytest.mark.parametrize("package", PACKAGES)
def test_layers_import_only_downwards(package):
    wrong = []
    for module, path in MODULES.items():
        if module.split(".")[0] != package:
            continue
        for dep in _imports(module, path):
            top = dep.split(".")[0]
            if top != package and top not in ALLOWED[package]:
                wrong.append(f"{module} -> {dep}")
    assert not wrong, wrong


def _defined_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)  # __slots__ entries, getattr/setattr by name
        elif isinstance(node, ast.keyword) and node.arg:
            names.add(node.arg)  # dataclass / namedtuple fields set by keyword
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return names


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def test_no_module_uses_another_modules_private_names():
    found = []
    for module, path in MODULES.items():
        tree = _parse(path)
        defined = _defined_names(tree)
        imported_modules = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                resolved = _resolve(module, node, path.name == "__init__.py")
                for alias in node.names:
                    own_submodule = node.level == 1 and node.module is None
                    if _private(alias.name) and not own_submodule:
                        found.append(f"{module}: imports {alias.name} from {node.module}")
                    if any(r.endswith("." + alias.name) for r in resolved if r in MODULES):
                        imported_modules.add(alias.asname or alias.name)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or not _private(node.attr):
                continue
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if isinstance(owner, ast.Name) and owner.id in imported_modules:
                found.append(f"{module}:{node.lineno}: {owner.id}.{node.attr}")
            elif node.attr not in defined and (module, node.attr) not in STDLIB_PRIVATE:
                found.append(f"{module}:{node.lineno}: .{node.attr} is defined elsewhere")
    assert not found, "\n".join(found)


def test_the_checks_see_the_tree():
    assert {"hal.device", "vm.codegen", "scheduler.executor", "server.app"} <= set(MODULES)
    assert os.path.isfile(ROOT / "pyproject.toml")


COMMAND_MODULE = "hal.command_buffer"


def test_only_the_command_buffer_module_knows_the_command_classes():
    """Commands describe themselves (`op`, `operands`): a module that tests a command's
    class (`type(c) is FillCommand`, `isinstance`, `case`) would be a second switch over
    command types, so no other module names the command classes at all."""
    tree = _parse(MODULES[COMMAND_MODULE])
    commands = {node.name for node in tree.body
                if isinstance(node, ast.ClassDef) and node.name.endswith("Command")}
    assert {"DispatchCommand", "FillCommand", "BarrierCommand"} <= commands
    found = []
    for module, path in MODULES.items():
        if module == COMMAND_MODULE:
            continue
        for node in ast.walk(_parse(path)):
            name = node.id if isinstance(node, ast.Name) else (
                node.attr if isinstance(node, ast.Attribute) else
                node.name if isinstance(node, ast.alias) else None)
            if name in commands:
                found.append(f"{module}:{getattr(node, 'lineno', '?')}: {name}")
    assert not found, "\n".join(found)


def _classes(module: str, tree: ast.Module) -> dict[str, tuple[list[str], set[str]]]:
    """class name -> (base names as written, the private methods it defines)."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            methods = {item.name for item in node.body
                       if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                       and _private(item.name)}
            out[node.name] = ([ast.unparse(b) for b in node.bases], methods)
    return out


def test_no_module_overrides_another_modules_private_method():
    classes = {m: _classes(m, _parse(p)) for m, p in MODULES.items()}
    found = []
    for module, path in MODULES.items():
        tree = _parse(path)
        origin = {}  # local name -> defining module, for names imported from the tree
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                for alias, target in zip(node.names,
                                         _resolve(module, node, path.name == "__init__.py")):
                    origin[alias.asname or alias.name] = target
        for cls, (bases, methods) in classes[module].items():
            for base in bases:
                home = origin.get(base)
                if home is None or home == module or base not in classes.get(home, {}):
                    continue
                for name in sorted(methods & classes[home][base][1]):
                    found.append(f"{module}.{cls}.{name} overrides {home}.{base}.{name}")
    assert not found, "\n".join(found)


DRIVER_PACKAGE = "hal.drivers"
# The names and IREE device ids of the built-in drivers: a caller comparing something
# with one of them is testing which driver it has instead of reading its capabilities.
DRIVER_NAMES = {"sync", "task", "emu", "local-sync", "local-task", "local-emu"}
# What a driver may use of the device it is composed into: nothing but the protocol.
# These are the device's and its queue's state that a driver reaching around the
# protocol would touch; of the queue `attach` gave it, it reads `lost` and `closed` and
# calls `lose`, nothing else.
DEVICE_INTERNALS = {"device", "work_queue", "transient", "recordings", "driver",
                    "perform_ready", "accept", "complete"}
QUEUE_USE = {"lost", "closed", "lose"}


def _is_driver_module(module: str) -> bool:
    return module == DRIVER_PACKAGE or module.startswith(DRIVER_PACKAGE + ".")


def _driver_name_tests(tree: ast.Module) -> list[tuple[int, str]]:
    """Comparisons (`==`, `!=`, `in`, `not in`, `match` cases) of anything with a driver's
    name or device id written as a literal."""
    def names_a_driver(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in DRIVER_NAMES
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return any(names_a_driver(e) for e in node.elts)
        return False

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(
                names_a_driver(x) for x in (node.left, *node.comparators)):
            found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.MatchValue) and names_a_driver(node.value):
            found.append((node.lineno, f"case {ast.unparse(node.value)}"))
    return found


def test_nothing_outside_a_driver_tests_which_driver_it_is():
    """Callers read `Device.capabilities` (and the driver's hooks); the only place that
    may name a driver is its own file and the registry that maps names to files."""
    found = []
    for module, path in MODULES.items():
        if _is_driver_module(module):
            continue
        for line, text in _driver_name_tests(_parse(path)):
            found.append(f"{module}:{line}: {text}")
    assert not found, "\n".join(found)


def test_drivers_reach_into_no_device_internals():
    """A driver module uses the device only through the protocol: it touches none of the
    device's or queue's state (`DEVICE_INTERNALS`), and its device class overrides no
    method of `Device` but `__init__` and `__repr__` (host transfers and affinity are the
    driver's hooks, not overrides)."""
    device_methods = {node.name for node in ast.walk(_parse(MODULES["hal.device"]))
                      if isinstance(node, ast.FunctionDef)}
    found = []
    for module, path in MODULES.items():
        if not _is_driver_module(module):
            continue
        tree = _parse(path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in DEVICE_INTERNALS:
                if ast.unparse(node.value) != "self" or node.attr == "device":
                    found.append(f"{module}:{node.lineno}: {ast.unparse(node)}")
            if (isinstance(node, ast.Attribute) and ast.unparse(node.value) == "self.work_queue"
                    and node.attr not in QUEUE_USE):
                found.append(f"{module}:{node.lineno}: {ast.unparse(node)}")
            if isinstance(node, ast.ClassDef) and any(
                    ast.unparse(b) == "Device" for b in node.bases):
                for item in node.body:
                    if (isinstance(item, ast.FunctionDef) and item.name in device_methods
                            and item.name not in ("__init__", "__repr__")):
                        found.append(f"{module}.{node.name} overrides Device.{item.name}")
    assert not found, "\n".join(found)


def test_the_driver_checks_catch_what_they_forbid():
    """The two checks above, on code that breaks them."""
    tests = _driver_name_tests(ast.parse(
        "a = device.driver_name == 'sync'\nb = name in ('task', 'x')\n"
        "match d:\n    case 'local-emu': pass\nc = name == 'synced'\n"))
    assert [line for line, _ in tests] == [1, 2, 4]


HAL_MODULE = "vm.hal_module"


def _hal_import_names() -> set[str]:
    """The `hal` module's exports as programs import them (`hal.<row name>`), read from
    the rows of its table."""
    names = set()
    for node in ast.walk(_parse(MODULES[HAL_MODULE])):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id == "Export" and node.args
                and isinstance(node.args[0], ast.Constant)):
            names.add(node.args[0].value)
    return names


def _import_name_uses(tree: ast.Module, names: set[str]) -> list[tuple[int, str]]:
    """String constants in code (docstrings are prose) that name one of `names` as
    programs import it (`hal.` and the row's name; the bare row names are also other
    modules' and the VM's own op names)."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            if (node.body and isinstance(node.body[0], ast.Expr)
                    and isinstance(node.body[0].value, ast.Constant)):
                docstrings.add(id(node.body[0].value))
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                and id(node) not in docstrings
                and any(f"hal.{n}" in node.value for n in names)):
            found.append((node.lineno, node.value))
    return found


def test_the_vm_names_no_hal_import_outside_the_hal_module():
    """What an import does to a recording is declared on its row (`Export.traits`): the
    translator, the recording-block sites and the context read the traits, so no VM
    module but the `hal` module's own names one of its imports."""
    names = _hal_import_names()
    assert {"command_buffer.create", "device.queue.execute", "fence.create"} <= names
    found = []
    for module, path in MODULES.items():
        if not module.startswith("vm.") or module == HAL_MODULE:
            continue
        for line, text in _import_name_uses(_parse(path), names):
            found.append(f"{module}:{line}: {text!r}")
    assert not found, "\n".join(found)


def test_the_import_name_check_catches_what_it_forbids():
    names = {"command_buffer.create", "device.queue.execute"}
    uses = _import_name_uses(ast.parse(
        '"""hal.command_buffer.create in a docstring is prose"""\n'
        'CREATE = "hal.command_buffer.create"\n'
        'if name == "hal.device.queue.execute": pass\n'
        'other = "hal.command_buffer.created_elsewhere"\n'), names)
    assert sorted(line for line, _ in uses) == [2, 3, 4]
