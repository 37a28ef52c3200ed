"""The run folder keeps a plain-text log of what a run prints (train.log, appended on resume), and every
interruption names the command that continues the run (issue 38: `cem train ... | tee log` kept nothing)."""

import pytest

from cem.cli import main
from cem.training import Interrupted, load_run_config, train
from cem.training.trainer import LOG

LOG_FILE = "train.log"  # RunDir.log_file


@pytest.mark.slow
def test_the_run_folder_keeps_a_log_appended_on_resume(tiny_args, tmp_path, capsys):
    cfg = load_run_config(None, ["context=32", "eval_every=2"], **{**tiny_args, "max_steps": 4, "arch": "cem", "log_every": 2})
    out = tmp_path / "run"
    assert isinstance(train(cfg, out, stop_at=2), Interrupted)
    first = (out / LOG_FILE).read_text()
    resume = f"continue with: cem train --out {out} --resume"
    assert resume in first and resume in capsys.readouterr().err  # the screen and the log say the same
    assert "step 2/4: loss " in first and "step 2: val loss " in first
    train(cfg, out, resume=True, progress=False)  # quiet on the screen, not in the log
    log = (out / LOG_FILE).read_text()
    assert log.startswith(first) and "resumed from" in log and "final evaluation, test: loss " in log and "results in" in log
    assert not capsys.readouterr().err and not LOG.handlers  # the file is closed once train returns


@pytest.mark.slow
def test_ctrl_c_in_the_final_evaluation_names_the_resume_command(tiny_args, tmp_path, monkeypatch, capsys):
    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr("cem.training.trainer._finish", interrupted)
    out = tmp_path / "run"
    assert main(["train", "--data", tiny_args["data"], "--preset", "tiny", "--max-steps", "2", "--out", str(out), "context=32", "tensorboard=false"]) == 130
    err = capsys.readouterr().err
    assert f"interrupted (Ctrl-C) during the final evaluation; the trained weights are saved in {out / 'ckpt'}: cem train --out {out} --resume" in err
    assert "cem train --out" in (out / LOG_FILE).read_text()
