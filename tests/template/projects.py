"""Projects made from this repository with Copier, as a user makes them: the template is this working tree
(tracked and new files) committed in a fresh git repository, copied with Copier's own `run_copy` and `run_update`.

The template's own tests (copier.yml's _exclude leaves tests/template/ out of every project).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml
from copier import run_copy

from tests.conftest import ROOT

GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "test", "GIT_AUTHOR_EMAIL": "test@example.com",
    "GIT_COMMITTER_NAME": "test", "GIT_COMMITTER_EMAIL": "test@example.com",
}  # fmt: skip
QUESTIONS = yaml.safe_load((ROOT / "copier.yml").read_text())
EXTRAS: dict[str, list[str]] = QUESTIONS["extra_paths"]["default"]
SUBPROCESS_TIMEOUT = 900


def generator():
    """.copier/generate.py as a module (a plain script, outside the package)."""
    spec = importlib.util.spec_from_file_location("copier_generate", ROOT / ".copier" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


GENERATE = generator()


def git(*args: str, cwd: Path) -> str:
    env = {**os.environ, **GIT_IDENTITY}
    return subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=True).stdout


def commit_tree(source: Path, repo: Path) -> Path:
    """The working tree of `source` (tracked and new files, not ignored ones; links as links) committed in a new
    repository."""
    listed = git("ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=source).split("\0")
    for name in filter(None, listed):
        path, copy = source / name, repo / name
        copy.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink():
            copy.symlink_to(os.readlink(path))
        elif path.is_file():  # not a file deleted but not yet committed
            shutil.copy2(path, copy)
    git("init", "-q", "-b", "main", cwd=repo)
    git("add", "-A", cwd=repo)
    git("commit", "-q", "-m", "template", cwd=repo)
    return repo


def make_project(template: Path, dest: Path, answers: dict) -> Path:
    run_copy(str(template), dest, data=answers, defaults=True, unsafe=True, vcs_ref="HEAD", quiet=True)
    return dest


def committed_project(template: Path, dest: Path, answers: dict) -> Path:
    """A project as its README says to start it: copied, then committed in its own repository."""
    make_project(template, dest, answers)
    git("init", "-q", "-b", "main", cwd=dest)
    git("add", "-A", cwd=dest)
    git("commit", "-q", "-m", "From the template", cwd=dest)
    return dest


def project_files(project: Path) -> list[Path]:
    return [project / name for name in GENERATE.files_under(project)]


def text_of(path: Path) -> str | None:
    try:
        return path.read_text()
    except UnicodeDecodeError:
        return None


def copier_cli(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """`copier ARGS` as a user runs it (its exit status is the caller's to check)."""
    command = [sys.executable, "-m", "copier", *args]
    environment = {**os.environ, **GIT_IDENTITY, **(env or {})}
    return subprocess.run(
        command, cwd=cwd, env=environment, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT
    )  # fmt: skip
