"""The paper's experiments (and ours beyond it), one command each, at cpu / gpu / paper scale."""

__version__ = "0.1.0"

from .costs import Deadline, DeadlineReached
from .launchers import LAUNCHERS, make_launcher, slurm_options
from .registry import ALL_IDS, EXPERIMENTS, SUITE_ORDER, akima_optimum
from .report import write_report
from .runner import analyse_finished, format_plan, plan, run_experiment, run_suite
from .scales import SCALES, Scale, get_scale, rehearsal
from .sweep import BlocksElsewhere, RunSpec, Variant, run_sweep

__all__ = [
    "ALL_IDS",
    "BlocksElsewhere",
    "Deadline",
    "DeadlineReached",
    "EXPERIMENTS",
    "LAUNCHERS",
    "SUITE_ORDER",
    "RunSpec",
    "SCALES",
    "Scale",
    "Variant",
    "akima_optimum",
    "analyse_finished",
    "format_plan",
    "get_scale",
    "make_launcher",
    "plan",
    "rehearsal",
    "run_experiment",
    "run_suite",
    "run_sweep",
    "slurm_options",
    "write_report",
]
