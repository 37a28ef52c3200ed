"""The README's table of findings quotes the committed cpu128 report: each row's paper figure, Δ with its interval and
verdict are a line of the report's first screen, and the regime figures its caption gives are the report's."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository
REPORT = ROOT / "study/results/cpu128/report.md"


def findings_section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("## What the study found")
    return text[start : text.index("\n## ", start + 1)]


def test_every_row_of_the_findings_table_is_a_line_of_the_report():
    rows = [line.split(" | ")[1:] for line in findings_section().splitlines() if line.startswith("| ") and "Fig." in line]
    assert 8 <= len(rows) <= 12, rows  # the paper's findings, at most 12
    report = [line for line in REPORT.read_text().splitlines() if line.startswith("| ")]
    for paper, delta, verdict in ((r[0], r[1], r[2].rstrip(" |")) for r in rows):
        line = next((x for x in report if f"| {paper} | {delta} |" in x), None)
        assert line is not None, f"no line of the report gives {paper} {delta}"
        assert line.split(" | ")[3].split(";")[0].endswith(verdict), (line, verdict)  # the raw verdict, as the report says it


def test_the_caption_quotes_the_regime_check_and_links_the_reports():
    section, report = findings_section(), REPORT.read_text()
    figures = re.findall(r"[+-]\d\.\d{4}\b", section)
    assert len(figures) >= 3 and all(f in report for f in figures), figures
    assert "8-gram" in section and "pipeline checks" in section
    assert "study/results/cpu/report.md" in section and "study/results/cpu128/report.md" in section
    assert "verdicts_paper.png" in section
