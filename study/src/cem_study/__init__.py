"""The paper's experiments (and ours beyond it), one command each, at cpu / gpu / paper scale.

Its public names are imported when first used (PEP 562), so that `python -m cem_study.records` and the other
modules run as scripts are not imported twice (once by the package, once as __main__)."""

from importlib import import_module

__version__ = "0.1.0"

_HOMES = {  # each public name, by the module that holds it
    **dict.fromkeys(("Deadline", "DeadlineReached"), "costs"),
    **dict.fromkeys(("LAUNCHERS", "make_launcher", "slurm_options"), "launchers"),
    **dict.fromkeys(("ALL_IDS", "EXPERIMENTS", "SUITE_ORDER", "akima_optimum"), "registry"),
    **dict.fromkeys(("write_report",), "report"),
    **dict.fromkeys(("analyse_finished", "format_plan", "plan", "run_experiment", "run_suite"), "runner"),
    **dict.fromkeys(("SCALES", "Scale", "get_scale", "rehearsal"), "scales"),
    **dict.fromkeys(("BlocksElsewhere", "RunSpec", "Variant", "run_sweep"), "sweep"),
}
__all__ = sorted(_HOMES, key=str.lower)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = globals()[name] = getattr(import_module(f".{_HOMES[name]}", __name__), name)
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
