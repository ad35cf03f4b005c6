import os
import subprocess
import sys

import pytest

from qeebm.cli import build_parser, main

SUBCOMMANDS = [["tinyworld", "build"], ["train"], ["translate"], ["evaluate"], ["score"], ["qe-check"], ["demo"]]


@pytest.mark.parametrize("words", SUBCOMMANDS, ids=[" ".join(w) for w in SUBCOMMANDS])
def test_every_subcommand_has_help(words, capsys):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args([*words, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "usage: qeebm" in out and len(out.splitlines()) > 3


def test_config_error_is_one_line_and_exit_2(capsys):
    assert main(["train", "optim.lrr=1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: unknown config key 'optim.lrr' (did you mean 'optim.lr'?)"


def test_console_script_exit_code(tmp_path):
    missing = tmp_path / "nope.tsv"
    proc = subprocess.run([sys.executable, "-m", "qeebm.cli", "evaluate", "--hyps", str(missing), "--test", str(missing)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: ")
    assert "nope.tsv" in proc.stderr


def test_train_and_translate_on_the_micro_world(micro_world, tmp_path, capsys):
    run = tmp_path / "run"
    overrides = [
        f"model.name_or_path={micro_world / 'nllb-base'}",
        f"data.train.path={micro_world / 'data/train.tsv'}",
        f"data.dev.path={micro_world / 'data/dev.tsv'}",
        "optim.max_steps=2", "optim.batch_size=4", "eval.every=0", "generation.num_beams=1",
        f"output.run_dir={run}", "logging.report_to=[]",
    ]
    assert main(["train", *overrides]) == 0
    assert (run / "final" / "config.json").is_file() and (run / "best" / "config.json").is_file()
    src = tmp_path / "src.txt"
    src.write_text("The teacher read a book.\nI will go.\n", encoding="utf-8")
    out = tmp_path / "hyp.txt"
    assert main(["translate", "--model", str(run / "final"), "-i", str(src), "-o", str(out), "--beams", "2", "--max-new-tokens", "8"]) == 0
    assert len(out.read_text(encoding="utf-8").splitlines()) == 2


NOISE = "pkg_resources is deprecated"


@pytest.mark.slow
def test_the_cli_keeps_third_party_deprecation_noise_out_of_stderr(tmp_path):
    from support.qe import model_dir, toy_triples

    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    # Importing qeebm filters nothing: a program that imports it and then pkg_resources (as comet's
    # dependencies do, 6 s of imports later) sees the warning.
    control = subprocess.run([sys.executable, "-c", "import qeebm.qe.scoring, pkg_resources"], env=env,
                             capture_output=True, text=True, timeout=120)
    if NOISE not in control.stderr:
        pytest.skip("this environment's setuptools raises no pkg_resources warning")
    src, mt, _ = toy_triples(4)
    pairs, scores = tmp_path / "pairs.tsv", tmp_path / "scores.txt"
    pairs.write_text("src\tmt\n" + "".join(f"{s}\t{m}\n" for s, m in zip(src, mt)), encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "qeebm.cli", "score", "--model", str(model_dir("kiwi")), "-i",
                           str(pairs), "-o", str(scores)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert len(scores.read_text().splitlines()) == 4 and NOISE not in proc.stderr and "Warning" not in proc.stderr
    # The processes a command starts (the demo's and the tiny world's workers) inherit the filter.
    code = ("import subprocess, sys\nfrom qeebm.utils.process import setup_process\nsetup_process()\n"
            "sys.exit(subprocess.run([sys.executable, '-c', 'import pkg_resources']).returncode)")
    child = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert child.returncode == 0 and NOISE not in child.stderr


def test_a_users_own_warning_options_come_after_the_noise_filters(monkeypatch):
    from qeebm.utils.process import setup_process

    monkeypatch.setenv("THP_MEM_ALLOC_ENABLE", "0")
    monkeypatch.setenv("PYTHONWARNINGS", "error::DeprecationWarning")
    setup_process()
    setup_process()  # idempotent
    # Later -W entries take precedence, so the user's own settings still win where they overlap.
    assert os.environ["PYTHONWARNINGS"] == ("ignore:pkg_resources is deprecated as an API:UserWarning,"
                                            "error::DeprecationWarning")
    assert os.environ["THP_MEM_ALLOC_ENABLE"] == "0"
