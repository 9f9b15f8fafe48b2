"""The package imports one way: no module of mathrl_jax imports, directly or through others, a module that
imports it back, whether at module level or inside a function (a lazy import that hides a circle is still one)."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "mathrl_jax"


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: pathlib.Path, modules: set) -> set:
    """The mathrl_jax modules a file imports, anywhere in it."""
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from a.b import c` imports a.b, and a.b.c when c is a module
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        found.update(name for name in names if name in modules)
    return found


def import_graph() -> dict:
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    modules = set(files)
    graph = {}
    for name, path in files.items():
        edges = imports_of(path, modules)
        # importing a.b.c runs a/__init__ and a/b/__init__ first
        edges |= {".".join(e.split(".")[:i]) for e in edges for i in range(2, e.count(".") + 1)} & modules
        graph[name] = edges - {name}
    return graph


def find_cycle(graph: dict):
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def is_package_init(name: str) -> bool:
    return (PACKAGE.parent / name.replace(".", "/") / "__init__.py").exists()


def test_no_import_circle_inside_the_package():
    graph = import_graph()
    # A package's __init__ re-exporting its own submodules is the one allowed back-edge: submodule -> its package.
    graph = {m: {e for e in edges if not (is_package_init(e) and m.startswith(e + "."))} for m, edges in graph.items()}
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_the_circle_finder_finds_a_circle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


# Rooms with doors. A package's modules named `_x` are behind its door: only modules of that package import them.
# A name `_y` is private to its module: no other module imports it. Scripts and examples go through doors like
# users do; tests may open a room they test (as optax's tests import optax._src).
OUTSIDE = [ROOT / "scripts", ROOT / "examples", ROOT / "benchmarks"]

# train/'s rooms and the rooms each may import: one way down, from the loop to the records.
ROOMS_MAY_IMPORT = {
    "algorithms": set(),
    "state": set(),
    "run_directory": set(),
    "update": {"state"},
    "reporting": {"run_directory"},
    "checkpoint": set(),
    "batch": {"algorithms", "state", "update"},
    "rollouts": {"batch"},
    "warmstart": {"rollouts", "reporting", "run_directory", "state", "update"},
    "setup": {
        "algorithms",
        "state",
        "run_directory",
        "update",
        "reporting",
        "checkpoint",
        "batch",
        "rollouts",
        "warmstart",
    },
    "export": {"state", "run_directory", "checkpoint"},
    "loop": {"state", "run_directory", "batch", "checkpoint", "reporting", "rollouts", "setup", "export"},
}


def private_crossings(path: pathlib.Path, own_package: str) -> list:
    """`(line, what)` for each import in `path` of a module or name behind another package's door."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            targets = [(node.module, alias.name) for alias in node.names]
        else:
            continue
        for module, name in targets:
            if not module.startswith("mathrl_jax"):
                continue
            parts = module.split(".") + ([name] if name else [])
            for i, part in enumerate(parts):
                if not part.startswith("_") or part.startswith("__"):
                    continue
                behind = ".".join(parts[:i])  # the package (or module) whose door `part` is behind
                is_module = (PACKAGE.parent / "/".join(parts[: i + 1])).with_suffix(".py").exists()
                if not is_module or not (own_package == behind or own_package.startswith(behind + ".")):
                    found.append((node.lineno, ".".join(parts[: i + 1])))
                break
    return found


def test_no_private_module_or_name_is_imported_across_a_door():
    crossings = []
    for path in PACKAGE.rglob("*.py"):
        package = module_name(path) if path.name == "__init__.py" else module_name(path).rsplit(".", 1)[0]
        crossings += [
            f"{path.relative_to(ROOT)}:{line} imports {what}" for line, what in private_crossings(path, package)
        ]
    for folder in OUTSIDE:
        for path in folder.rglob("*.py"):
            crossings += [
                f"{path.relative_to(ROOT)}:{line} imports {what}" for line, what in private_crossings(path, "")
            ]
    assert not crossings, "\n".join(crossings)


def test_the_door_check_sees_a_crossing(tmp_path):
    path = tmp_path / "user.py"
    path.write_text(
        "from mathrl_jax.train.update._step import make_update_fn\n"
        "from mathrl_jax.train.update import _step\n"
        "import mathrl_jax.train.update._passes as passes\n"
        "from mathrl_jax.rewards.extraction import _private_helper\n"
        "from mathrl_jax.train.update import make_update_fn\n"
    )
    assert [what for _, what in private_crossings(path, "mathrl_jax.train.batch")] == [
        "mathrl_jax.train.update._step",
        "mathrl_jax.train.update._step",
        "mathrl_jax.train.update._passes",
        "mathrl_jax.rewards.extraction._private_helper",
    ]
    # inside its own room, a private module is open; a private name of another module never is
    assert [what for _, what in private_crossings(path, "mathrl_jax.train.update")] == [
        "mathrl_jax.rewards.extraction._private_helper"
    ]


def room_of(module: str):
    parts = module.split(".")
    return parts[2].lstrip("_") if len(parts) > 2 and parts[:2] == ["mathrl_jax", "train"] else None


def room_imports(graph: dict) -> dict:
    """(room, room it imports) -> the modules whose import makes that edge."""
    edges = {}
    for module, imported in graph.items():
        for target in imported:
            here, there = room_of(module), room_of(target)
            if here and there and here != there:
                edges.setdefault((here, there), []).append(f"{module} -> {target}")
    return edges


def test_train_rooms_import_only_the_rooms_below_them():
    graph = import_graph()
    rooms = {room_of(m) for m in graph} - {None}
    assert rooms == set(ROOMS_MAY_IMPORT), f"train/ holds {sorted(rooms)}; give each new room its row"
    wrong = [
        f"{here} may not import {there}: {', '.join(why)}"
        for (here, there), why in sorted(room_imports(graph).items())
        if there not in ROOMS_MAY_IMPORT[here]
    ]
    assert not wrong, "\n".join(wrong)
    outside = [f"{m} imports {e}" for m, edges in graph.items() if not room_of(m) for e in edges if room_of(e)]
    assert not outside, "nothing of mathrl_jax below train/ imports it: " + "; ".join(outside)


def test_the_room_check_sees_an_upward_import():
    graph = {"mathrl_jax.train.update._step": {"mathrl_jax.train.setup._build"}}
    assert list(room_imports(graph)) == [("update", "setup")]
    assert "setup" not in ROOMS_MAY_IMPORT["update"]
