"""A run's one metrics file (metrics.jsonl), the table derived from it, and the removal of the duplicate
metrics.csv that older runs wrote beside it."""

import json
import re

import pytest

from cem.training.metrics import MetricsLogger, drop_duplicate_csv, metrics_csv, read_metrics

# what the logger wrote to metrics.csv before 2026-11-27 for these two calls (its rows are `metrics_csv`'s)
RECORDS = [{"step": 25, "loss": 4.493119716644287, "lr": 0.0012820512820512823, "tokens": 51200},
           {"step": 25, "val_loss": float("nan")}]  # fmt: skip
OLD_CSV = "step,key,value\r\n25,loss,4.493119716644287\r\n25,lr,0.0012820512820512823\r\n25,tokens,51200\r\n25,val_loss,nan\r\n"


def text(path):
    with open(path, newline="") as f:  # as written: csv rows end in \r\n
        return f.read()


def logged(path, records=RECORDS, legacy_csv=False):
    """A finished run folder at `path` whose logger got `records` (with an older run's metrics.csv too)."""
    path.mkdir(parents=True)
    if legacy_csv:  # the older logger's table: its header, then the rows it appended with the jsonl's
        (path / "metrics.csv").write_text(metrics_csv([]), newline="")
    logger = MetricsLogger(path, tensorboard=False)
    for r in records:
        logger.log(**r)
    logger.close()
    (path / "results.json").write_text("{}")
    return path


def test_the_logger_writes_one_metrics_file(tmp_path):
    run = logged(tmp_path / "r")
    assert sorted(p.name for p in run.iterdir()) == ["metrics.jsonl", "results.json"]
    back = read_metrics(run)
    assert back[0] == RECORDS[0] and back[1]["val_loss"] != back[1]["val_loss"]  # NaN survives
    assert metrics_csv(back) == OLD_CSV


def test_an_older_runs_table_is_continued_not_restarted(tmp_path):
    run = logged(tmp_path / "r", RECORDS[:1], legacy_csv=True)
    logger = MetricsLogger(run, tensorboard=False)
    logger.log(**RECORDS[1])
    logger.close()
    assert text(run / "metrics.csv") == OLD_CSV == metrics_csv(read_metrics(run))


def test_duplicate_tables_of_finished_runs_are_removed(tmp_path):
    a = logged(tmp_path / "runs" / "a", legacy_csv=True)
    b = logged(tmp_path / "runs" / "b", legacy_csv=True)
    (b / "results.json").unlink()  # unfinished: left alone
    c = logged(tmp_path / "runs" / "c")  # already one file
    assert drop_duplicate_csv(tmp_path) == [a / "metrics.csv"]
    assert not (a / "metrics.csv").exists() and (b / "metrics.csv").exists() and (a / "metrics.jsonl").exists()
    assert read_metrics(a)[0] == RECORDS[0] and drop_duplicate_csv(tmp_path) == [] and not (c / "metrics.csv").exists()


@pytest.mark.parametrize("damage,why", [
    (lambda run: (run / "metrics.csv").write_text(OLD_CSV.replace("4.493119716644287", "4.49311971664428")), "line 2 is '25,loss,4.49311971664428'"),
    (lambda run: (run / "metrics.jsonl").write_text((run / "metrics.jsonl").read_text() + json.dumps({"step": 26, "loss": 4.4}) + "\n"),
     "it has 5 lines, the jsonl gives 6"),
    (lambda run: (run / "metrics.jsonl").unlink(), "no metrics.jsonl beside it"),
])  # fmt: skip
def test_a_table_that_differs_from_its_jsonl_is_named_and_nothing_is_removed(tmp_path, damage, why):
    good = logged(tmp_path / "good", legacy_csv=True)
    bad = logged(tmp_path / "bad", legacy_csv=True)
    damage(bad)
    with pytest.raises(ValueError, match=re.escape(str(bad / "metrics.csv")) + ".*" + re.escape(why)) as err:
        drop_duplicate_csv(tmp_path)
    assert str(good) not in str(err.value)
    assert (good / "metrics.csv").exists() and (bad / "metrics.csv").exists()
