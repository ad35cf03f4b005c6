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


def test_demo_quick_prints_the_method_table_with_selection_rows(micro_world, tmp_path, capsys, monkeypatch):
    from qeebm.config import SYSTEMS
    from qeebm.demo import run_demo

    monkeypatch.chdir(tmp_path)
    table = run_demo(world_dir=str(micro_world), quick=True, steps=2)
    rows = [line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| ") and "seeds" not in line]
    assert rows[:-4] == ["base (baseline)", *SYSTEMS]
    best = rows[-3][:-len("+rerank")]
    assert best in SYSTEMS and rows[-4:] == ["base+rerank", f"{best}+rerank", "base+mbr", f"{best}+mbr"]
    assert "Selection among candidates" in table
    # The smoke run keeps out of the full demo's directory, so the full demo does not try to resume it.
    out = tmp_path / "runs" / "demo-quick"
    assert (out / "comparison" / "comparison.csv").is_file() and not (tmp_path / "runs" / "demo").exists()
    assert any((out / "comparison" / "plots").glob("*.png"))
