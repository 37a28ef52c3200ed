"""The README's paragraph of findings quotes the committed reports: every figure it gives is in study/results/cpu/report.md,
study/results/cpu128/report.md or the H200 campaign's study/results/h200/cpu128/report.md."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository


def findings_section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("## What our study has found so far")
    return text[start : text.index("\n## ", start + 1)]


def test_every_figure_of_the_findings_is_in_the_report():
    section = findings_section()
    report = "\n".join((ROOT / f"study/results/{scale}/report.md").read_text() for scale in ("cpu", "cpu128", "h200/cpu128"))
    figures = re.findall(r"[+-]\d\.\d{4}\b|[+-]\d+\.\d+%|\b\d+ runs\b", section)
    assert len(figures) >= 8, figures  # the regime check, both fig2a differences and their intervals, the run count
    missing = [f for f in figures if f not in report]
    assert not missing, f"README findings quote figures the report does not hold: {missing}"


def test_the_findings_link_the_reports():
    assert "study/results/cpu/report.md" in findings_section() and "study/results/cpu128/report.md" in findings_section()
