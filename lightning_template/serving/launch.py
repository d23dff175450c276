"""serve.py in a background process, for tests, benchmarks and scripts that need a live server."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import requests

SERVE = Path(__file__).resolve().parents[2] / "serve.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def background_server(*args: str, cwd: Path, startup_s: float = 90) -> Iterator[str]:
    """Start `serve.py *args` on a free port of 127.0.0.1 and yield its URL once /health answers."""
    with server_process(*args, cwd=cwd, startup_s=startup_s) as (url, _):
        yield url


@contextlib.contextmanager
def server_process(
    *args: str, cwd: Path, startup_s: float = 90, prefix: Sequence[str] = ()
) -> Iterator[tuple[str, subprocess.Popen]]:
    """`background_server`, yielding the URL and the process (`prefix` runs it under another command).

    The server runs in its own process group (LitServe starts worker processes), stopped on exit.
    Its output goes to `cwd/serve-<port>.log`, quoted if it dies before becoming healthy.
    """
    port = free_port()
    log_path = cwd / f"serve-{port}.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [*prefix, sys.executable, str(SERVE), *args, "--port", str(port)],
            cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + startup_s
            while True:
                if process.poll() is not None:
                    raise RuntimeError(f"serve.py exited {process.returncode}:\n{log_path.read_text()[-3000:]}")
                with contextlib.suppress(requests.ConnectionError):
                    if requests.get(f"{url}/health", timeout=2).text == "ok":
                        break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"serve.py did not become healthy in {startup_s} s; see {log_path}")
                time.sleep(0.5)
            yield url, process
        finally:
            with contextlib.suppress(ProcessLookupError):  # a test may have stopped it already
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
