"""Hyperparameter search over train.py's flags with Optuna: resumable, prunable, parallel.

    python tune.py --config configs/simple_cnn.yaml --search configs/search/simple_cnn.yaml --trials 20 \\
        --trainer.max_epochs=3

Every flag that is not one of the options below goes to every trial's `train.py fit` (a shorter budget, a preset).
Run the same command again to continue a stopped search (with other train.py flags it is refused:
a study keeps the settings it was started with). `--workers N` runs N trials at once (one per GPU,
or N processes sharing the CPU's threads); on several machines, start tune.py on each with one
`--storage` URL (configs/slurm/tune.sbatch).
Results: logs/tune/<study>/{results.csv,results.md,<study>_best.yaml,plots/}.
See lightning_template/search/search.py for how interruptions are handled.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import optuna
from jsonargparse import ArgumentParser
from optuna.trial import TrialState

from lightning_template.engine.errors import ConfigError
from lightning_template.script_args import did_you_mean, parse_known, script_parser
from lightning_template.search import runs, workers
from lightning_template.search.search import (
    Search,
    SearchError,
    check_choices,
    check_settings,
    make_pruner,
    make_sampler,
    open_storage,
    recover,
    write_report,
)
from lightning_template.search.space import SpaceError, load_space


def parser() -> ArgumentParser:
    parser = script_parser(__doc__)
    parser.add_argument(
        "--config", action="append", required=True, help="Job config, as for train.py; given again, stacked in order."
    )
    parser.add_argument("--search", type=str, required=True, help="Search space YAML (configs/search/).")
    parser.add_argument("--trials", type=int, default=20, help="Finished trials (complete or pruned) to reach.")
    parser.add_argument("--study", type=str | None, default=None, help="Study name; null: <job>-<search>.")
    parser.add_argument(
        "--storage", type=str | None, default=None,
        help="Optuna RDB URL; null: sqlite:///logs/tune/<study>/study.db.",
    )  # fmt: skip
    parser.add_argument("--sampler", default="tpe", choices=["tpe", "random", "grid"], help="Optuna's sampler.")
    parser.add_argument(
        "--pruner",
        default="median",
        choices=["median", "none"],
        help="median: stop a trial below the median of the others at the same epoch; none: never.",
    )
    parser.add_argument("--prune_after_epochs", type=int, default=1, help="Never prune before this many epochs.")
    parser.add_argument("--seed", type=int | None, default=None, help="Sampler seed (the trials' own is train.py's).")
    workers.add_options(parser)
    return parser


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    tune_parser = parser()
    args, train_flags = parse_known(tune_parser, argv)
    search_file = Path(args.search)
    if args.trials < 1:
        sys.exit("tune.py: --trials must be at least 1.")
    try:
        workers.set_threads(args.threads)
        params = load_space(search_file)
        job_flags = [f"--config={c}" for c in args.config]
        config = runs.RunConfig.parse([*job_flags, *train_flags])
        config.check_single_process("tune.py")
        environments = workers.assignments(args.workers, str(config.namespace.trainer.get("accelerator")))
        for param in params:  # every choice and both ends of every range, each on its own to name it
            for value in param.values:
                try:
                    config.with_values({param.key: value})
                except runs.FlagError as err:
                    raise SpaceError(
                        f"--search {search_file}: train.py refuses the key or value of {param.key} ({value!r}):\n{err}"
                    ) from None
        # Parsed before any run, as every config here: the best config is written from it at the end.
        job = runs.RunConfig.parse([*job_flags, *runs.without_budget(train_flags)])
        monitor, mode = config.namespace.checkpoint.monitor, config.namespace.checkpoint.mode
        if not monitor:
            raise SearchError("The search optimizes --checkpoint.monitor; set it (e.g. val_acc).")
        study_name = args.study or f"{Path(args.config[0]).stem}-{search_file.stem}"
        out = Path("logs") / "tune" / study_name
        storage_url = args.storage or f"sqlite:///{out / 'study.db'}"
        storage = open_storage(storage_url)
        study = optuna.create_study(
            study_name=study_name,
            storage=storage,
            sampler=make_sampler(args.sampler, params, args.seed),
            pruner=make_pruner(args.pruner, args.prune_after_epochs),
            direction="maximize" if mode == "max" else "minimize",
            load_if_exists=True,
        )
        check_choices(study, params, search_file)
        check_settings(study, storage_url, config.settings(), params)
    except ConfigError as err:  # the space, the storage, train.py's flags, --workers: one line
        sys.exit(f"tune.py: {err}\n{did_you_mean(str(err), tune_parser, getattr(err, 'options', ()))}".rstrip())
    search = Search(
        study, config, job, job_flags, train_flags, params, args.trials, f"tune/{study_name}", monitor, storage
    )
    recover(study, storage, params)
    print(f"Study '{study_name}': {args.trials - search.budget_left()} of {args.trials} trials done or running.")
    if args.workers > 1:
        # Each worker's sampler its own seed: with one seed, they would all propose the same parameters.
        seeds = [[] if args.seed is None else [f"--seed={args.seed + i}"] for i in range(args.workers)]
        run_workers(search, out, [[*argv, *seed] for seed in seeds], environments)
        return
    try:
        search.run(on_trial_end=lambda: write_report(study, search, out, final=False))
    except runs.Interrupted:  # Ctrl-C or SIGTERM: the trial saved its last.ckpt and is resumed next time
        stopped(search, out)
    except SearchError as err:
        print(f"tune.py: {err}", file=sys.stderr, flush=True)
        failed = True
    else:
        failed = False
    if args.worker:  # the process that started this one reports
        sys.exit(1 if failed else 0)
    report(search, out, failed)


def run_workers(search: Search, out: Path, argvs: list[list[str]], environments: list[dict[str, str]]) -> None:
    """The search in one process per argv and environment, on this study; the report when all have ended."""
    codes = workers.launch(__file__, argvs, environments)
    if 128 + signal.SIGTERM in codes:  # stopped (Ctrl-C, SIGTERM): the trials saved their last.ckpt
        stopped(search, out)
    for i, code in enumerate(codes):
        if code != 0:  # an error of its own (said), or killed outright: its trial is resumed by another
            print(f"worker {i} {workers.describe(code)}", flush=True)
    recover(search.study, search.storage, search.params)  # a trial whose worker died with nobody left to resume it
    if left := search.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        print(f"{len(left)} interrupted trial(s) left: run the same command to resume them.", flush=True)
    report(search, out, failed=bool(left) or 1 in codes)


def stopped(search: Search, out: Path) -> None:
    write_report(search.study, search, out, final=False)  # the tables only (no plots): a stop is prompt
    print(f"Search stopped ({out}/results.md so far): run the same command to continue it.", flush=True)
    sys.exit(128 + signal.SIGTERM)


def report(search: Search, out: Path, failed: bool) -> None:
    best = write_report(search.study, search, out)
    print(f"Results: {out}/results.md", flush=True)
    if best:
        print(f"Best config: {best}\nTrain it: python train.py fit --config {best}", flush=True)
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
