"""The `cem-study` command line: experiment and report (also `python -m cem_study`)."""

from __future__ import annotations

import sys
from pathlib import Path

from cem.cli import ALWAYS, Applies, Parser, check_named, field_docs, given_flags, run_command

PROG = "cem-study"


def _seeds(text: str) -> tuple[int, ...]:
    """--seeds "0,1,2": distinct integers >= 0."""
    try:
        seeds = tuple(int(s) for s in text.split(","))
    except ValueError:
        raise ValueError(f"--seeds must be comma-separated integers, e.g. 0,1,2; got {text!r}") from None
    if not seeds or min(seeds) < 0 or max(seeds) >= 2**63 or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds must be distinct integers in [0, 2**63), got {text!r}")
    return seeds


def _sizes(text: str, scale) -> tuple[str, ...]:
    """--sizes "cpu96,cpu128": distinct sizes of the scale, in the scale's order; at a scale that sweeps learning
    rates, its base size among them (the other sizes' grids are centred on its choice)."""
    sizes = tuple(z.strip() for z in text.split(","))
    unknown = [z for z in sizes if z not in scale.sizes]
    if not sizes or unknown or len(set(sizes)) != len(sizes):
        raise ValueError(f"--sizes must be distinct sizes of the {scale.name} scale, comma-separated ({', '.join(scale.sizes)}); got {text!r}")
    if scale.lr_sweep and scale.base not in sizes:
        raise ValueError(f"--sizes {text}: the {scale.name} scale sweeps learning rates, and its other sizes' grids are centred on "
                         f"its base size's choice: include {scale.base}")
    return tuple(z for z in scale.sizes if z in sizes)


PLAN = Applies(lambda a: not a.plan, "with --plan, which trains and analyses nothing (checked as for the run)", warn=True)
ANALYSE = Applies(lambda a: not a.analyse_only, "with --analyse-only, which trains nothing (checked as for the run)", warn=True)
SLURM = Applies(lambda a: a.launcher == "slurm", "without --launcher slurm (a setting of SLURM's jobs)")
SUBMITIT = Applies(lambda a: a.launcher != "process", "with --launcher process (a setting of submitit's jobs: --launcher local or slurm)")
TRAINING = (PLAN, ANALYSE)  # what only training reads

FLAGS = {  # each subcommand's flags (by dest) and where each has an effect (`cem.cli.check_flags`)
    "experiment": {
        **dict.fromkeys(("id", "scale", "results", "seeds", "processor", "rehearse", "plan"), ALWAYS),
        "sizes": (ANALYSE,),
        "analyse_only": (Applies(lambda a: not a.plan, "with --plan: give one of them (--plan writes nothing, --analyse-only the report)"),),
        **dict.fromkeys(("data_dir", "device", "allow_short"), (PLAN,)),
        **dict.fromkeys(("jobs", "devices", "nproc_per_run", "until", "launcher"), TRAINING),
        **dict.fromkeys(("partition", "gpus_per_run", "slurm_option"), (SLURM, *TRAINING)),
        **dict.fromkeys(("time_min", "cpus_per_run"), (SUBMITIT, *TRAINING)),
    },
    "report": dict.fromkeys(("results_dir", "allow_short"), ALWAYS),
}


def _launcher(ex, args, results: str):
    """The launcher the run trains with, and its deadline (`--until`): built in every mode, so that --plan and
    --analyse-only refuse what the run would."""
    from cem.checks import check_nonnegative_int, check_positive_int

    from .costs import Deadline

    check_named("--until", args.until, "give a time as HH:MM or an ISO date and time, or leave --until out")
    for flag, value, check in (("--time-min", args.time_min, check_positive_int), ("--cpus-per-run", args.cpus_per_run, check_positive_int),
                               ("--gpus-per-run", args.gpus_per_run, check_nonnegative_int)):
        if value is not None:
            check(flag, value)
    options = {k: v for k, v in (("slurm_partition", args.partition), ("timeout_min", args.time_min), ("gpus_per_node", args.gpus_per_run),
                                 ("cpus_per_task", args.cpus_per_run)) if v is not None}
    until = Deadline.parse(args.until) if args.until is not None else None
    return ex.make_launcher(args.launcher, args.jobs, args.devices, args.nproc_per_run, Path(results) / ".submitit", until,
                            **options, **ex.slurm_options(args.slurm_option))


def cmd_experiment(args) -> int:
    import cem_study as ex
    from cem.checks import check_positive_int

    from .costs import DeadlineReached
    from .sweep import BlocksElsewhere

    check_named("--results", args.results, "give a folder, or leave --results out for the default results/SCALE")
    check_named("--processor", args.processor, "give a processor's name as its runs record it, or leave --processor out")
    if args.jobs is not None:
        check_positive_int("--jobs", args.jobs)
    ids = None if args.id == "all" else tuple(args.id.split(","))  # all: the scale's suite
    overrides = {}
    if args.seeds:
        seeds = _seeds(args.seeds)
        overrides.update(seeds=seeds, recursion_seeds=seeds)
    sizes = _sizes(args.sizes, ex.get_scale(args.scale)) if args.sizes else ex.get_scale(args.scale).sizes
    narrow = {"sizes": sizes} if sizes != ex.get_scale(args.scale).sizes else {}  # trains and plans; the analysis reads every size
    if args.rehearse:
        overrides.update(ex.rehearsal(ex.get_scale(args.scale)))
    if args.processor:
        overrides.update(processor=args.processor)
    results = args.results or f"results/{args.scale}" + ("-rehearsal" if args.rehearse else "")
    if args.device not in (None, "auto"):
        from cem.device import pick_device

        pick_device(args.device)  # an unknown device is refused before any run starts
    if Path(results).exists() and not Path(results).is_dir():
        raise ValueError(f"--results {results} is a file; name a folder for the results")
    launcher = _launcher(ex, args, results)
    if args.plan:
        print(ex.format_plan(ex.plan(args.scale, results, ids, **overrides, **narrow)))
        return 0
    if args.analyse_only:
        summaries, waiting = ex.analyse_finished(args.scale, results, args.data_dir, ids, args.device, **overrides)
        for i, what in waiting.items():
            print(f"{i}: not analysed, {what}")
        _print_findings(ex, args.scale, summaries)
        if not summaries:
            print(f"no experiment has all its runs finished in {results}: no report written")
            return 0
        print(f"report: {ex.write_report(results, allow_short=args.allow_short or args.rehearse)}")
        return 0
    try:
        summaries = ex.run_suite(args.scale, results, args.data_dir, launcher.jobs, ids, args.device, launcher, **overrides, **narrow,
                                 **({"analyse": False} if narrow else {}))
    except (DeadlineReached, BlocksElsewhere) as e:  # the runs that fitted (or that this processor may train) have finished:
        print(e)                                     # an orderly stop, no report until all are in
        return 0
    if narrow:  # some sizes: their runs trained, and the analysis, whose Holm families span every size, waits
        print(f"trained the runs of {', '.join(sizes)}: not analysed, as the analysis reads every size of the {args.scale} scale "
              f"(its families of findings span them); analyse with --analyse-only, without --sizes")
        return 0
    _print_findings(ex, args.scale, summaries)
    if not summaries:  # every experiment of the suite waits for another's choice or cannot be built here (named above)
        print(f"no experiment could run at the {args.scale} scale yet: no report written")
        return 0
    # the smoke scale's and a rehearsal's runs are short by design (a few steps): the report says so in its first line
    short = args.allow_short or args.rehearse or not ex.get_scale(args.scale).findings
    print(f"report: {ex.write_report(results, allow_short=short)}")
    return 0


def _print_findings(ex, scale: str, summaries: list[dict]) -> None:
    from .report import pipeline_check

    for summary in summaries:
        for f in summary["findings"]:  # a scale that never speaks (smoke): differences as pipeline checks, no verdicts
            print(f"{summary['experiment']}: [{f['verdict']}] {f['claim']} -- {f['evidence']}" if ex.get_scale(scale).findings
                  else f"{summary['experiment']}: pipeline check: {pipeline_check(f)}")


def cmd_report(args) -> int:
    import cem_study as ex

    print(ex.write_report(args.results_dir, allow_short=args.allow_short))
    return 0


def build_parser() -> Parser:
    from cem.training import TrainConfig

    from . import ALL_IDS, LAUNCHERS, SCALES, __version__
    from .costs import DEADLINE_MARGIN

    docs = field_docs(TrainConfig)
    parser = Parser(prog=PROG, description="The paper's experiments on cem: sweeps, analyses, findings and their report")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)  # subcommands are Parser too

    p = sub.add_parser("experiment", help="run the paper's experiments (one, several, or 'all') at a scale, then write the report")
    p.add_argument("id", help=f"an experiment, a comma-separated list, or all: {', '.join(ALL_IDS)}")
    p.add_argument("--scale", default="cpu", choices=tuple(SCALES), help="cpu, gpu and paper follow the paper's budget; smoke is a few steps (default cpu)")
    p.add_argument("--results", help="results directory (default results/SCALE); finished runs there are skipped")
    p.add_argument("--data-dir", dest="data_dir", help=docs["data_dir"])
    p.add_argument("--jobs", type=int, help="runs trained at once (CPU: processes sharing the cores; default: one per device group "
                                            "with --devices, else 1); with --launcher slurm, the jobs in the queue at once")
    p.add_argument("--devices", help="device ids shared out to the jobs, --nproc-per-run to a group, e.g. 0,1,2,3 (default with --jobs "
                                     "or --nproc-per-run above 1 on a CUDA machine: its visible devices; each job sees only its group)")
    p.add_argument("--nproc-per-run", dest="nproc_per_run", type=int, default=1,
                   help="processes per run, under torchrun's launcher (DDP, the same global batch; default 1)")
    p.add_argument("--launcher", default="process", choices=tuple(LAUNCHERS),
                   help="where runs train: process (this machine, default), local or slurm (each run a submitit job, needs "
                        "submitit; job files in RESULTS/.submitit)")
    p.add_argument("--partition", help="slurm: the partition")
    p.add_argument("--time-min", dest="time_min", type=int, help="local, slurm: a job's time limit in minutes (default 1440; a job "
                                                                   "timed out is requeued and resumes from its checkpoint)")
    p.add_argument("--gpus-per-run", dest="gpus_per_run", type=int, help="slurm: GPUs per job (default --nproc-per-run; 0 on a CPU cluster)")
    p.add_argument("--cpus-per-run", dest="cpus_per_run", type=int, help="local, slurm: CPUs per job")
    p.add_argument("--slurm-option", dest="slurm_option", action="append", default=[], metavar="KEY=VALUE",
                   help="slurm: another sbatch setting, as submitit names it (e.g. account=ABC, qos=high, constraint=h100); repeatable")
    p.add_argument("--seeds", help="comma-separated seeds for every experiment (default: the scale's)")
    p.add_argument("--sizes", help="comma-separated sizes of the scale to train, e.g. cpu96 (default: all the scale's; at a scale that "
                                   "sweeps learning rates, its base size among them): their runs train and the command stops, as the "
                                   "analysis reads every size (--analyse-only, without --sizes)")
    p.add_argument("--until", metavar="WHEN", help="start no run that would not finish by WHEN (HH:MM, the next such time, or an ISO date and "
                                                   f"time), its time estimated as --plan's, times {DEADLINE_MARGIN:g}; the runs that fit train, "
                                                   "then the command stops and says what is left (run it again to go on)")
    p.add_argument("--device", default="auto", help="device of the analyses that evaluate trained models: " + docs["device"])
    p.add_argument("--allow-short", action="store_true", dest="allow_short",
                   help="write the report even if runs are short of the Chinchilla budget (its first line says so)")
    p.add_argument("--plan", action="store_true", help="only say what would be trained and evaluated, per experiment, and an estimate of the time")
    p.add_argument("--analyse-only", action="store_true", dest="analyse_only",
                   help="train and evaluate nothing: analyse the experiments whose runs have all finished (under the paper's rate rule "
                        "at least; a rule still waiting is named in the report) and write the report; say what the others wait for")
    p.add_argument("--processor", help="train only on this processor, named as its runs record it (a GPU's name; a CPU's model name with its family, "
                                       "e.g. 'AMD EPYC (AuthenticAMD family 25 model 17 stepping 1)': elsewhere the refusal names the machine's): "
                                       "refuse elsewhere, and train again any finished run recorded on another, so that no pair of runs crosses processors")
    p.add_argument("--rehearse", action="store_true",
                   help="the suite in shape (corpus, sizes, learning-rate sweeps, seeds, analyses, report) at 3 steps per run, into "
                        "results/SCALE-rehearsal unless --results: finds a pipeline error in minutes, before a suite of hours; never findings")
    p.set_defaults(func=cmd_experiment, applies=FLAGS["experiment"])

    p = sub.add_parser("report", help="write RESULTS_DIR/report.md from experiment results")
    p.add_argument("results_dir", help=f"a results directory written by `{PROG} experiment`")
    p.add_argument("--allow-short", action="store_true", dest="allow_short", help="accept runs short of the Chinchilla budget (the report's first line says so); the smoke scale's "
                   "report needs none: a pipeline check, without verdicts")
    p.set_defaults(func=cmd_report, applies=FLAGS["report"])
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        parser = build_parser()  # imports torch: seconds in which a Ctrl-C is one line too
        argv = sys.argv[1:] if argv is None else argv
        args = parser.parse_args(argv)
        args.given = given_flags(parser, argv)
        return run_command(args, PROG)
    except KeyboardInterrupt:  # before a command runs (`run_command` says it for the command itself)
        print(f"{PROG}: error: interrupted (Ctrl-C)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
