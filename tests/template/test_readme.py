"""The README's "Start your own project" lines, run as they are written, on a machine like a stranger's: Copier
in a venv of its own, as pipx installs it (no uv beside it nor on PATH), Debian's data packages hidden,
Fashion-MNIST in the folder that FASHION_MNIST_DIR names (what torchvision's download would give, offline here), a
fresh folder; the questions answered in a terminal, as a person types.

The lines are read from README.md's code block: the day it says something that does not work, this test fails.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.conftest import ROOT
from tests.template.projects import (
    GIT_IDENTITY,
    SUBPROCESS_TIMEOUT,
    commit_tree,
    copier_in_terminal,
    git,
    without_system_data,
)

CLEAR, ENTER = "\x15", "\r"  # Ctrl-U erases the question's default, as a person replaces it


def readme_lines(readme: str) -> list[str]:
    """The commands of the README's "Start your own project" code block, in order."""
    section = readme[readme.index("\n## Start your own project\n") :]
    block = re.search(r"```bash\n(.*?)```", section, flags=re.S)
    assert block, "README.md: no ```bash block under 'Start your own project'"
    return [line for line in block[1].splitlines() if line.strip() and not line.startswith("#")]


def copier_as_pipx_installs_it(folder: Path) -> Path:
    """A venv whose `copier` command runs this environment's Copier with the venv's own Python, beside which there
    is no uv: what `pipx install copier` gives a stranger. Returns the venv's bin folder."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=300)
    python = folder / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], check=True,
                          capture_output=True, text=True, timeout=60).stdout.strip()  # fmt: skip
    (Path(site) / "copier_here.pth").write_text(sysconfig.get_path("purelib") + "\n")
    script = folder / "bin" / "copier"
    script.write_text(f"#!{python}\nimport sys\nfrom copier.__main__ import CopierApp\nsys.exit(CopierApp.run())\n")
    script.chmod(0o755)
    return folder / "bin"


def strangers_environment(copier_bin: Path, fashion_mnist: Path) -> dict[str, str]:
    """This environment without what a stranger's shell lacks: no venv activated, no uv on PATH, no outer make or
    PYTHONPATH; Copier's venv on PATH; FASHION_MNIST_DIR a copy outside Debian's folders."""
    ours = Path(sys.executable).parent
    path = [d for d in os.environ["PATH"].split(os.pathsep) if Path(d) != ours and not (Path(d) / "uv").exists()]
    outer = {"PYTHONPATH", "VIRTUAL_ENV", "MAKEFLAGS", "MAKELEVEL", "MFLAGS", "UV", "FORTUNES_DIR"}
    env = {k: v for k, v in os.environ.items() if k not in outer}
    return {**env, **GIT_IDENTITY, "PATH": os.pathsep.join([str(copier_bin), *path]),
            "FASHION_MNIST_DIR": str(fashion_mnist)}  # fmt: skip


@pytest.mark.slow
def test_the_readme_lines_make_a_project_that_trains_and_passes_its_tests(tmp_path: Path, fashion_mnist_dir) -> None:
    """pipx's Copier (checked against the README's version range, not installed again), `copier copy` with the
    template's path for `<template>` (the core alone: `a` unticks every extra), then the README's next lines in one
    shell, in order; `make train` ends with its test accuracy, `make test` passes, and the first commit held
    everything (`git status` is clean after both)."""
    lines = readme_lines((ROOT / "README.md").read_text())
    install, copy, *rest = lines
    (requirement,) = [Requirement(spec) for spec in shlex.split(install, comments=True)[2:]]
    assert install.startswith("pipx install") and requirement.name == "copier", install
    from copier import __version__

    assert requirement.specifier.contains(__version__), f"Copier {__version__} is not {requirement}"

    template = commit_tree(ROOT, tmp_path / "template")
    data = shutil.copytree(fashion_mnist_dir, tmp_path / "downloads" / "fashion-mnist")  # as if downloaded
    copier_bin = copier_as_pipx_installs_it(tmp_path / "copier-venv")
    env = strangers_environment(copier_bin, data)
    folder = tmp_path / "fresh"
    folder.mkdir()
    words = shlex.split(copy.replace("<template>", str(template)), comments=True)
    assert words[:2] == ["copier", "copy"], copy
    replies = [("project's name", CLEAR + "Leaf Disease Classifier" + ENTER), ("Python package", ENTER),
               ("extras", "a" + ENTER), ("data", ENTER)]  # fmt: skip
    status, screen = copier_in_terminal(words[1:], replies, folder, program=[str(copier_bin / "copier")], env=env)
    assert status == 0 and "Traceback" not in screen and "make lock" not in screen, screen[-3000:]

    done = subprocess.run([*without_system_data(), "sh", "-e", "-c", "\n".join(rest)], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=3 * SUBPROCESS_TIMEOUT)  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    assert re.search(r"^test accuracy: 0\.\d{4}$", done.stdout, flags=re.M), done.stdout[-3000:]
    summary = [line for line in done.stdout.splitlines() if " passed" in line][-1]
    assert " failed" not in summary and " error" not in summary, summary
    project = folder / words[-1]
    assert git("status", "--porcelain", cwd=project) == "", "the README's commit left files out or changed"
