"""Every `scripts/train.py` command of README.md and docs/ writes a run directory of its own: a reader who runs
them in turn never resumes one run with another's settings (a resume with other settings is refused), and never
finds the default's run directory taken (issue 48: the reward-function command failed on `runs/default` after
command 1; the scaling commands wrote there too)."""

import importlib.util
import os
import pathlib
import re
import shlex

ROOT = pathlib.Path(__file__).resolve().parents[2]


def train_commands():
    """(file, command text) of every command line that runs scripts/train.py, continuation lines joined."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for language, block in re.findall(r"```(\w*)\n(.*?)```", path.read_text(), re.S):
            if language not in ("", "bash", "sh", "console"):
                continue
            text = re.sub(r"\\\n\s*", " ", block)
            for line in text.splitlines():
                line = line.split(" #", 1)[0].strip().rstrip("&").strip().strip('"')
                if re.search(r"(^|\s|/)python3? scripts/train\.py", line) and "--help" not in line:
                    found.append((path.relative_to(ROOT).as_posix(), line[line.index("scripts/train.py") :]))
    return found


def run_dir_of(command: str) -> str:
    """The run directory `command` writes: its --config.run_dir, else its config file's, else the default's."""
    words = shlex.split(command.replace("...", ""))
    given = [w.split("=", 1)[1] for w in words if w.startswith("--config.run_dir=")]
    if given:
        return given[-1]
    config = [w.split("=", 1)[1] for w in words if w.startswith("--config=")]
    config += [words[i + 1] for i, w in enumerate(words[:-1]) if w == "--config"]
    path = ROOT / (config[-1] if config else "mathrl_jax/configs/default.py")
    spec = importlib.util.spec_from_file_location("recipe", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config().run_dir


def settings_of(command: str) -> tuple:
    """What a command sets besides where it writes (its config file and overrides)."""
    command = command.replace("--config mathrl_jax/configs/default.py", "")  # the default named or not
    words = shlex.split(command.replace("...", ""))
    return tuple(sorted(w for w in words[1:] if not w.startswith("--config.run_dir=")))


def test_the_docs_show_train_commands():
    files = {file for file, _ in train_commands()}
    assert {"README.md", "docs/scaling.md", "docs/vllm.md", "docs/training.md"} <= files, files


def test_each_train_command_writes_its_own_run_directory():
    by_dir = {}
    for file, command in train_commands():
        by_dir.setdefault(os.path.normpath(run_dir_of(command)), []).append((file, command))
    for run_dir, commands in by_dir.items():
        kinds = {settings_of(command) for _, command in commands}
        assert len(kinds) == 1, f"{run_dir} is written by commands of different settings: {commands}"
