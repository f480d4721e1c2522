"""The tiny-llm command line: every subcommand's help, options parsed to what they mean (``all``
samples, audit words), a bad option refused by argparse, a refusal one line with exit status 2."""

import json
import subprocess
import sys

import pytest
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from tiny_llm.cli import _audit, _samples, main


def test_samples_and_audit_words_mean_what_they_say():
    import argparse

    assert _samples("all") is None and _samples("8") == 8
    assert [_audit(w) for w in ("auto", "on", "true", "off", "false")] == ["auto", True, True, False, False]
    for bad, parse in (("0", _samples), ("some", _samples), ("yes", _audit)):
        with pytest.raises(argparse.ArgumentTypeError, match="expected"):
            parse(bad)


def test_a_bad_option_is_refused_by_the_parser_with_status_2(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["analyze-state", "--noise-samples", "0"])
    assert exit_.value.code == 2 and "expected a positive integer or 'all', got '0'" in capsys.readouterr().err


def test_help_needs_no_torch():
    code = "import sys; from tiny_llm.cli import _parser; _parser(); assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_help_describes_every_subcommand_and_shows_defaults(capsys):
    for command in ("prepare-data", "train", "analyze-state", "analyze-spectrum", "plot-analysis"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = capsys.readouterr().out
        description = text.split("\n\n")[1]
        assert not description.startswith(("positional", "options")) and "``" not in text, command
    with pytest.raises(SystemExit):
        main(["analyze-spectrum", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Eigenpairs reported (largest algebraic, and largest magnitude). (default: 3)" in text
    assert "once every wanted eigenpair has converged (lanczos_tolerance). (default: 100)" in text


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
