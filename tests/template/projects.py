"""Projects made from this repository with Copier, as a user makes them: the template is this working tree
(tracked and new files) committed in a fresh git repository, copied with Copier's own `run_copy` and `run_update`.

The template's own tests (copier.yml's _exclude leaves tests/template/ out of every project).
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import pty
import re
import select
import shutil
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import yaml

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


def make_project(template: Path, dest: Path, answers: dict, **options) -> Path:
    from copier import run_copy  # Copier where it is used: at collection every test process would import it

    run_copy(str(template), dest, data=answers, defaults=True, unsafe=True, vcs_ref="HEAD", quiet=True, **options)
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


def without_system_data() -> list[str]:
    """The start of a command that runs without Debian's data packages, as on a machine that lacks them: their
    folders hidden in a private mount namespace (Linux, as root). Nothing where that cannot be done."""
    hidden = [d for d in ("/usr/share/datasets", "/usr/share/games") if Path(d).is_dir()]
    if os.geteuid() != 0 or not shutil.which("unshare") or not hidden:
        return []
    mounts = " && ".join(f"mount -t tmpfs none {d}" for d in hidden)
    return ["unshare", "-m", "sh", "-c", f'{mounts} && exec "$@"', "sh"]


ANSI = re.compile(r"\x1b(\[[0-9;?]*[ -/]*[@-~]|[()][0-9A-Za-z]|[=>])")


def copier_in_terminal(
    args: list[str], replies: list[tuple[str, str]], cwd: Path, program: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> tuple[int | None, str]:  # fmt: skip
    """`copier ARGS` in a pseudo-terminal, as a person types: for each (prompt, keys), waits until the screen shows
    the prompt's words, then types the keys. Returns its exit status and what the terminal showed (escapes removed);
    a prompt that never comes ends the wait with the status None. `program`: the command that is Copier (this
    Python's by default); `env`: its whole environment (this one's by default)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))  # 50 lines of 200 columns
    environment = {**(os.environ if env is None else env), **GIT_IDENTITY, "TERM": "xterm"}
    process = subprocess.Popen(
        [*(program or [sys.executable, "-m", "copier"]), *args], cwd=cwd, stdin=slave, stdout=slave, stderr=slave,
        env=environment, start_new_session=True,
    )  # fmt: skip
    os.close(slave)
    shown = bytearray()

    def screen() -> str:
        return ANSI.sub("", shown.decode(errors="replace"))

    def read(seconds: float) -> bool:
        """Reads what comes within `seconds`; False once the terminal is closed."""
        if not select.select([master], [], [], seconds)[0]:
            return True
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the process ended: its side of the terminal is closed
            return False
        if b"\x1b[6n" in chunk:  # prompt_toolkit asks where the cursor is, as a real terminal answers
            os.write(master, b"\x1b[1;1R")
        shown.extend(chunk)
        return bool(chunk)

    try:
        for prompt, keys in replies:
            deadline, seen = time.monotonic() + 60, len(screen())
            while prompt not in screen()[seen:]:
                if time.monotonic() > deadline or not read(0.2):
                    return None, screen()
            time.sleep(0.3)  # the prompt drawn whole before the keys come
            os.write(master, keys.encode())
        deadline = time.monotonic() + SUBPROCESS_TIMEOUT
        while read(1.0) and time.monotonic() < deadline:  # to its end: the terminal closes when it exits
            pass
        return process.wait(timeout=60), screen()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(master)
