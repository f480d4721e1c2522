"""The command line's way with bad input: one line on stderr, exit status 2; under torchrun the same
line in the rank's error file, which torchrun's failure report (the last thing it prints) shows."""

import json

from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from tiny_llm.cli import main


def test_a_refusal_is_one_line_and_under_torchrun_the_line_its_report_shows(tmp_path, monkeypatch, capsys):
    argv = ["analyze-state", "--run", str(tmp_path / "none"), "--checkpoint", "final.pt", "--case", "seen"]
    argv += ["--output", str(tmp_path / "out/r.json")]
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    assert main(["--quiet", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("tiny-llm analyze-state: error: ") and "resolved.yaml" in err
    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    assert main(["--quiet", *argv]) == 2
    assert json.loads(error_file.read_text())["message"] == err
    report = ProcessFailure(local_rank=0, pid=1, exitcode=2, error_file=str(error_file))  # what torchrun reads
    assert report.message == err
    assert not (tmp_path / "out").exists()
