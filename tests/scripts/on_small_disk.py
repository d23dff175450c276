"""`train.py <args>` with its working folder on a small filesystem of its own: a tmpfs of SIZE mounted on FOLDER, in
the private mount namespace this script runs in (`unshare -m --propagation private`), gone with it.

Run by tests/test_disk_full.py: python on_small_disk.py FOLDER SIZE OUT [--kill-rewrite] -- <train.py args>
OUT (outside the tmpfs) receives `rc`, `stdout`, `stderr` and a copy of the run's `logs/`, as the run left them.
--kill-rewrite: SIGKILL the run as soon as last.ckpt, once written, is being written again (another file appears
beside it, or it shrinks), and say in `caught` whether that moment was caught.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def kill_during_rewrite(run: subprocess.Popen, folder: Path) -> bool:
    """Poll the run's checkpoint folder; True if it was killed while last.ckpt was being written a second time."""
    largest = 0
    while run.poll() is None:
        for checkpoints in folder.glob("logs/*/*/checkpoints"):
            names = set(os.listdir(checkpoints))
            last = checkpoints / "last.ckpt"
            size = last.stat().st_size if "last.ckpt" in names else 0
            if size and (len(names) > 1 or size < largest):
                run.send_signal(signal.SIGKILL)
                run.wait()
                return True
            largest = max(largest, size)
        time.sleep(0.001)
    return False


def main() -> None:
    folder, size, out = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    kill = sys.argv[4] == "--kill-rewrite"
    args = sys.argv[sys.argv.index("--") + 1 :]
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], check=True)
    with open(out / "stdout", "w") as stdout, open(out / "stderr", "w") as stderr:
        run = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *args], cwd=folder, stdout=stdout,
                               stderr=stderr)  # fmt: skip
        if kill:
            (out / "caught").write_text(str(kill_during_rewrite(run, folder)))
        (out / "rc").write_text(str(run.wait()))
    if (folder / "logs").is_dir():
        shutil.copytree(folder / "logs", out / "logs", symlinks=True)


if __name__ == "__main__":
    main()
