"""The same job over several seeds or k folds, each an ordinary train.py run, summarised as mean ± std.

Runs go to `logs/multirun/<name>/{seed_42,fold_0,...}/` (with MLflow or W&B, to the tracker, named
so). A finished run leaves `result.json` there and is not run again; an interrupted one is resumed
from its last.ckpt (exact resume) in the same tracker run, so rerunning the same command after a
stop finishes the set. Both files hold the run's resolved settings: a rerun whose flags or config
contents resolve otherwise is refused, naming what changed, before anything runs.

A run being trained holds `claim.json` (host and process): several processes on one set
(`multirun.py --workers N`) take the runs in turn, wait for each other's, and take over a run whose
process died on this machine, resuming it from its last.ckpt.
"""

from __future__ import annotations

import json
import math
import os
import socket
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from lightning_template.engine.errors import ConfigError
from lightning_template.search import runs
from lightning_template.search.workers import process_alive, process_token

POLL_S = 2  # how often a process waiting on another's runs looks again


def variants(seeds: list[int] | None, folds: int | None) -> list[tuple[str, dict[str, int]]]:
    """(run folder, the values it sets) for each seed or each fold."""
    if folds is not None:
        if folds < 2:
            raise ConfigError(f"--folds {folds}: k-fold needs at least 2 folds.")
        return [(f"fold_{i}", {"data.num_folds": folds, "data.fold": i}) for i in range(folds)]
    repeated = sorted({s for s in seeds or [] if seeds.count(s) > 1})
    if repeated:  # one run per seed: a repeat would count one run twice in the mean and std
        raise ConfigError(
            f"--seeds {' '.join(map(str, seeds))}: seed {', '.join(map(str, repeated))} is given more than once;"
            " each seed is one run: give distinct seeds."
        )
    return [(f"seed_{s}", {"seed_everything": s}) for s in seeds or []]


@dataclass(frozen=True)
class Run:
    folder: str
    config: runs.RunConfig
    settings: dict[str, Any]


def plan(base: runs.RunConfig, name: str, chosen: list[tuple[str, dict[str, int]]]) -> tuple[Path, list[Run]]:
    """The folder of the set and its runs, each checked against what its folder already holds."""
    out = Path("logs") / "multirun" / name
    base.check_single_process("multirun.py")
    todo = []
    for folder, values in chosen:
        config = base.with_values(values)
        todo.append(Run(folder, config, config.settings()))
    for run in todo:  # every run checked before the first one starts
        _refuse_other_settings(out, run.folder, run.settings)
    return out, todo


def run_pending(out: Path, name: str, todo: list[Run]) -> None:
    """Run each run of `todo` not done yet, unless another process runs it: then wait for it, and take it over
    (resuming from its last.ckpt) if that process dies. Several processes share a set this way."""
    for run in todo:
        if (done := out / run.folder / "result.json").is_file():
            print(f"{run.folder}: done before ({done})", flush=True)
    said: set[str] = set()
    while pending := [run for run in todo if not (out / run.folder / "result.json").is_file()]:
        ran = False
        for run in pending:
            if (out / run.folder / "result.json").is_file():  # finished by another process meanwhile
                continue
            holder = _claim(out / run.folder / "claim.json")
            if holder is not None:
                if run.folder not in said:
                    print(f"{run.folder}: run by {holder}; waiting for it", flush=True)
                    said.add(run.folder)
                continue
            try:
                _run(out, name, run)
            finally:  # stopped: the next process resumes it from its last.ckpt
                (out / run.folder / "claim.json").unlink(missing_ok=True)
            ran = True
        if not ran:
            time.sleep(POLL_S)


def _run(out: Path, name: str, run: Run) -> None:
    record_file, done = out / run.folder / "run.json", out / run.folder / "result.json"
    record = json.loads(record_file.read_text()) if record_file.is_file() else None
    config = run.config.named(f"multirun/{name}", run.folder).resumed(record)
    if config.ckpt_path:
        print(f"{run.folder}: resuming (--ckpt_path={config.ckpt_path})", flush=True)
    started = runs.RunStarted(lambda started: record_file.write_text(json.dumps({**started, "settings": run.settings})))
    result = {"run": run.folder, **asdict(runs.fit(config, callbacks=[started])), "settings": run.settings}
    tmp = done.with_name(f".{done.name}.{os.getpid()}")  # whole or absent, for the processes that wait on it
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(done)


def _claim(path: Path) -> str | None:
    """Take `path` for this process (None), or say which live process holds it. A claim of a process of this
    machine that has died is taken over; another machine's is trusted until its file is removed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    me = {"host": socket.gethostname(), "process": process_token()}
    for _ in range(3):
        try:
            with path.open("x") as f:  # O_EXCL: one process wins
                json.dump(me, f)
            return None
        except FileExistsError:
            pass
        try:
            holder = json.loads(path.read_text())
        except (OSError, ValueError):  # being written, or just released: look again next time
            return "another process"
        if holder.get("host") != me["host"] or process_alive(holder.get("process", "0:")):
            return f"process {holder.get('process', '?').split(':')[0]} on {holder.get('host', '?')}"
        try:  # its process died: one process moves its claim away and takes the run
            path.rename(path.with_name(f".{path.name}.{os.getpid()}.dead"))
        except FileNotFoundError:
            return "another process"
        path.with_name(f".{path.name}.{os.getpid()}.dead").unlink()
        print(f"{path.parent.name}: its process ({holder['process'].split(':')[0]}) died; taking it over", flush=True)
    return "another process"


def collected(out: Path, todo: list[Run]) -> tuple[list[dict[str, Any]], list[str]]:
    """The finished runs' results, and the folders of those not finished."""
    done = [out / run.folder / "result.json" for run in todo]
    return [json.loads(f.read_text()) for f in done if f.is_file()], [f.parent.name for f in done if not f.is_file()]


def _refuse_other_settings(out: Path, folder: str, now: dict[str, Any]) -> None:
    """A finished or started run of `folder` with other flags or config contents is not this run."""
    for file in (out / folder / "result.json", out / folder / "run.json"):
        if file.is_file():
            before = json.loads(file.read_text()).get("settings", now)  # runs saved without settings: kept
            if before != now:
                raise ConfigError(
                    f"{out / folder} was run with other train.py settings ({runs.differences(before, now)}):"
                    f" give --name a new name for a new set of runs, or delete {out} to run this set again."
                )
            return


def summary_rows(results: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Columns and rows: one row per run, then mean and std (n-1) of every metric."""
    monitor = results[0]["monitor"]
    keys = sorted({k for r in results for k in r["metrics"] if k.startswith(("val_", "test_"))} - {monitor})
    columns = ["run", f"best {monitor}", *keys]

    def values(result: dict[str, Any]) -> list[float]:
        return [result["best_score"], *(result["metrics"].get(k, math.nan) for k in keys)]

    table = [values(r) for r in results]
    rows = [[r["run"], *(f"{v:.4f}" for v in vals)] for r, vals in zip(results, table, strict=True)]
    columns_values = list(zip(*table, strict=True))
    rows.append(["mean", *(f"{statistics.fmean(c):.4f}" for c in columns_values)])
    if len(results) > 1:
        rows.append(["std", *(f"{statistics.stdev(c):.4f}" for c in columns_values)])
    return columns, rows


def write_summary(results: list[dict[str, Any]], out: Path) -> str:
    columns, rows = summary_rows(results)
    markdown = "\n".join(
        ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns), *("| " + " | ".join(r) + " |" for r in rows)]
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.md").write_text(markdown + "\n")
    (out / "summary.csv").write_text("\n".join(",".join(r) for r in [columns, *rows]) + "\n")
    mean = dict(zip(columns, rows[-2 if len(results) > 1 else -1], strict=True))
    std = dict(zip(columns, rows[-1], strict=True)) if len(results) > 1 else {}
    lines = [f"{c}: {mean[c]}" + (f" ± {std[c]}" if std else "") for c in columns[1:]]
    return markdown + "\n\nmean ± std over " + f"{len(results)} runs:\n  " + "\n  ".join(lines)
