"""The ``qeebm`` command. Each subcommand parses its arguments and calls one library function;
imports are lazy so ``qeebm --help`` answers in a fraction of a second."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from qeebm.errors import QeebmError
from qeebm.metrics.registry import DEFAULT_MODELS, DESCRIPTIONS, SACREBLEU_METRICS
from qeebm.utils.process import setup_process

CONFIG_HELP = "YAML file with the settings that differ from the defaults (see qeebm/config.py and each method's module in qeebm/methods/)"
OVERRIDE_HELP = "dotted overrides applied after the YAML file, e.g. optim.lr=1e-4 model.lora.enabled=true"


def _setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
    )


def cmd_tinyworld_build(args: argparse.Namespace) -> None:
    from qeebm.tinyworld.build import build

    build(args.dir, seed=args.seed, size=args.size, force=args.force, qe=args.qe)


def cmd_tinyworld_build_top(args: argparse.Namespace) -> None:
    from qeebm.tinyworld.toprange import add_top_range
    from qeebm.tinyworld.world import is_built

    if not is_built(args.dir):
        raise QeebmError(f"{args.dir}: not a built tiny world (no manifest.json); build it first")
    report = add_top_range(args.dir, size=args.size)
    print(json.dumps({name: r.get("top_range", {}) for name, r in report.items() if isinstance(r, dict)}, indent=2))


def cmd_tinyworld_build_qe(args: argparse.Namespace) -> None:
    from qeebm.tinyworld.build import ship_qe

    print(f"shipped quality estimators written to {ship_qe(args.out, work=args.work)}")


def cmd_train(args: argparse.Namespace) -> None:
    from qeebm.config import load_config
    from qeebm.training.loop import train

    cfg = load_config(args.config, args.overrides)
    result = train(cfg)
    print(f"run directory: {result.run_dir}")


def cmd_translate(args: argparse.Namespace) -> None:
    from qeebm.evaluation.command import generation_from_args
    from qeebm.translation.qad import selection_from_args
    from qeebm.translation.translator import translate_file

    selection = selection_from_args(args, DEFAULT_MODELS)
    translate_file(args.model, args.src_lang, args.tgt_lang, args.input, args.output, generation_from_args(args),
                   selection=selection)


def cmd_evaluate(args: argparse.Namespace) -> None:
    from qeebm.evaluation.command import evaluate_main

    evaluate_main(args)


def cmd_score(args: argparse.Namespace) -> None:
    from qeebm.qe.scoring import score_file

    score_file(args.model, args.input, args.output, batch_size=args.batch_size)


def cmd_qe_check(args: argparse.Namespace) -> None:
    from qeebm.analysis.qe_check import run

    result = run(args.qe, args.translator, args.dev, args.out, src_lang=args.src_lang, tgt_lang=args.tgt_lang,
                 comet=args.comet, samples=args.samples, max_sentences=args.max_sentences, beams=args.beams,
                 max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, qe_batch_size=args.qe_batch_size,
                 seed=args.seed, device=args.device, probe_steps=args.probe_steps, probe_batch=args.probe_batch,
                 probe_samples=args.probe_samples, probe_lr=args.probe_lr)
    print(Path(args.out, "qe_check.md").read_text(encoding="utf-8"), end="")
    print(f"report: {args.out}/qe_check.md, {args.out}/qe_check.json (verdict: {result['verdict']['level']})")


def cmd_demo(args: argparse.Namespace) -> None:
    from qeebm.experiments.demo import default_systems, run_demo

    systems = [s.strip() for s in args.systems.split(",")] if args.systems else None
    known = default_systems()
    if systems == ["all"]:
        systems = known
    unknown = [s for s in systems or [] if s not in known]
    if unknown:
        raise QeebmError(f"--systems: unknown {', '.join(unknown)}; choose from {', '.join(known)}")
    run_demo(world_dir=args.world, runs_dir=args.runs, quick=args.quick, seeds=args.seeds, steps=args.steps,
             base=args.base, systems=systems, train_plateau=args.train_plateau)


def add_decoding_args(g) -> None:
    """Decoding options of ``translate`` and ``evaluate`` (cli_evaluate.generation_from_args reads them)."""
    g.add_argument("--beams", type=int, default=5, help="beam size (default 5)")
    g.add_argument("--max-new-tokens", type=int, default=50, help="default 50")
    g.add_argument("--sample", action="store_true", help="sample instead of beam search (with --rerank/--mbr: "
                   "sampled candidates)")
    g.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default 1)")
    g.add_argument("--top-k", type=int, default=0, help="sample among the k likeliest tokens (default 0: all)")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling (default 1: off)")
    g.add_argument("--epsilon", type=float, default=0.0,
                   help="epsilon sampling: never draw a token below this probability (default 0: off; e.g. 0.02)")
    g.add_argument("--batch-size", type=int, default=32, help="decoding batch size (default 32)")


def add_selection_args(p, models: str) -> None:
    """``--rerank`` / ``--mbr`` / ``--candidates`` (qeebm/translation/qad.py; qad.selection_from_args reads them)."""
    from qeebm.translation.qad import DEFAULT_CANDIDATES

    g = p.add_argument_group(
        "quality-aware decoding", f"make --candidates translations per segment (the N best of a beam of "
        f"max(--beams, N), or N samples with --sample) and keep one: the best by a QE, or by MBR. {models}")
    g.add_argument("--rerank", nargs="?", const="kiwi", metavar="QE",
                   help="keep the candidate with the highest score of this reference-free QE (default: kiwi)")
    g.add_argument("--mbr", nargs="?", const="chrf", metavar="UTILITY",
                   help="minimum Bayes risk: keep the candidate with the highest mean UTILITY against all "
                   "candidates: chrf (chrF++, default) or a reference-based COMET")
    g.add_argument("--candidates", type=int, metavar="N",
                   help=f"candidates per segment (default {DEFAULT_CANDIDATES})")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="qeebm",
        description="Train translators against a learned quality estimator (QE-EBM) and its baselines.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("tinyworld", help="the offline synthetic language pair and its tiny models")
    tw = p.add_subparsers(dest="tinyworld_command", required=True, metavar="ACTION")
    b = tw.add_parser(
        "build",
        help="generate data, tokenizers, base translators and quality estimators into DIR",
        description="Generate the tiny world deterministically (docs/tinyworld.md): English -> "
        "pseudo-Mongolian data (the task's labelled 20%% / source-only pool / dev / test, the bases' "
        "narrow corpus, the QEs' judged sentences), XLM-R-, mBART-50- and NLLB-style tokenizers, tiny "
        "M2M100 and MBart base translators and the tiny CometKiwi, COMET and judge. The same seed gives "
        "identical files.",
    )
    b.add_argument("dir", help="output directory (e.g. data/tinyworld)")
    b.add_argument("--seed", type=int, default=0, help="world seed (default 0)")
    b.add_argument("--size", choices=["default", "micro"], default="default",
                   help="'micro' is a seconds-long build for tests")
    b.add_argument("--force", action="store_true", help="rebuild even if DIR holds a finished build")
    b.add_argument("--qe", choices=["auto", "build"], default="auto",
                   help="auto (default): copy the QEs shipped in data/tinyworld-qe when they were built from "
                   "this build's inputs, else train them (about 9 minutes on 2 cores); build: always train them")
    b.set_defaults(func=cmd_tinyworld_build)
    q = tw.add_parser(
        "build-qe",
        help="rebuild the shipped quality estimators (data/tinyworld-qe)",
        description="Build the default world with its quality estimators trained, and keep the QEs, their "
        "held-out rows and report, and the hashes of the inputs they came from in OUT. A default build "
        "copies them from there when its own inputs hash the same.",
    )
    q.add_argument("out", nargs="?", default="data/tinyworld-qe", help="output directory (default %(default)s)")
    q.add_argument("--work", help="build the world here instead of a temporary directory (kept)")
    q.set_defaults(func=cmd_tinyworld_build_qe)
    t = tw.add_parser(
        "build-top",
        help="give a built world QEs that see the top of the quality range (docs/tinyworld.md)",
        description="Train converged systems and QE-trained systems from them on the world's QE split, judge "
        "their outputs, train the world's kiwi further on them and its held-out judge (a reference-based "
        "tiny COMET) on its shard's (the first ones are kept as kiwi-lowrange and judge-lowrange); qe/qe_report.json "
        "gains every QE's top-range correlations. A full "
        "`tinyworld build --qe build` runs this stage itself.")
    t.add_argument("dir", help="a built tiny world (e.g. data/tinyworld)")
    t.add_argument("--size", choices=["default", "micro"], default="default", help="the world's size (default %(default)s)")
    t.set_defaults(func=cmd_tinyworld_build_top)

    p = sub.add_parser(
        "train",
        help="train a translator with one method (sft, qe-ebm, reinforce, ppo, grpo, qe-finetune, dpo, cpo)",
        description="Train with the method named by the config key 'method'. Settings: the dataclass "
        "defaults (qeebm/config.py; a method's section in its module), then --config YAML, then dotted overrides. Resumes from run_dir if it "
        "holds a checkpoint. Multi-process: accelerate launch -m qeebm.cli train ...",
        epilog="methods (method=NAME), and the config sections that set them:\n"
        "  sft          CE on the labelled pairs                                   optim.*\n"
        "  qe-ebm       CE + the QE's energy on samples (qe.mode static|dynamic)   qe_ebm.*, qe.*\n"
        "  reinforce    CE + policy gradient, the QE's score as reward             reinforce.*, guards.*\n"
        "  ppo          PPO, the QE's score as reward, KL to the initial model     ppo.*, guards.*\n"
        "  grpo         CE + GRPO: each source's samples are their own baseline    grpo.*, guards.*\n"
        "  qe-finetune  CE + CE on the QE's (or MBR's) pick of N candidates        qe_finetune.*\n"
        "  dpo          CE + DPO on the QE's best and worst of N candidates        preference.*, guards.*\n"
        "  cpo          CE + CPO (no reference model, NLL on the best) likewise    preference.*, guards.*\n"
        "the reward of reinforce, ppo, grpo, qe-finetune, dpo, cpo: qe.path, or the weighted sum of reward.terms\n"
        "examples (recipes/configs/tiny_*.yaml, after `qeebm tinyworld build data/tinyworld`):\n"
        "  qeebm train --config recipes/configs/tiny_sft.yaml\n"
        "  qeebm train --config recipes/configs/tiny_qe-ebm-static.yaml qe_ebm.rho=0.3 output.run_dir=runs/qe-ebm",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", "-c", help=CONFIG_HELP)
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help=OVERRIDE_HELP)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("translate", help="translate a text file, one segment a line",
                       description="Translate INPUT (one source segment a line) into OUTPUT.",
                       epilog="examples:\n"
                       "  qeebm translate --model runs/sft/best -i src.txt -o hyp.txt\n"
                       "  qeebm translate --model runs/sft/best -i src.txt -o hyp.txt --rerank data/tinyworld/qe/kiwi\n"
                       "  qeebm translate --model runs/sft/best -i src.txt -o hyp.txt --mbr --sample --epsilon 0.02 "
                       "--candidates 16",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="hub id or local directory (NLLB-200 or mBART-50 family)")
    p.add_argument("--src-lang", default="eng_Latn", help="NLLB code, e.g. eng_Latn (default)")
    p.add_argument("--tgt-lang", default="khk_Cyrl", help="NLLB code, e.g. khk_Cyrl (default)")
    p.add_argument("--input", "-i", required=True, help="source file")
    p.add_argument("--output", "-o", required=True, help="where to write translations")
    add_decoding_args(p)
    add_selection_args(p, "QE and UTILITY: a comet directory or hub id (kiwi: Unbabel/wmt22-cometkiwi-da, "
                       "comet: Unbabel/wmt22-comet-da).")
    p.set_defaults(func=cmd_translate)

    p = sub.add_parser(
        "evaluate", help="translate a test set and score it: BLEU, chrF++, TER, COMET, COMET-Kiwi, XCOMET, judges",
        description="Translate the test corpus with a model (beam search) or take --hyps; score it with\n"
        "sacrebleu BLEU / chrF++ / TER (as the sacrebleu command line) and COMET-family models (as\n"
        "comet-score: fp16, batch 16); write the evaluation report (qeebm/evaluation/report.py) that\n"
        "scripts/compare.py reads. Default metrics: all of them; with --tinyworld, the world's own\n"
        "QEs and no XCOMET. Each QE model is loaded only while it scores.",
        epilog="examples:\n"
        "  qeebm evaluate --tinyworld data/tinyworld --run runs/tiny_qe-ebm-static\n"
        "  qeebm evaluate --model runs/sft/best --test test.tsv --metrics bleu,chrf,ter,comet,kiwi -o sft.json\n"
        "  qeebm evaluate --hyps out.txt --test test.tsv --no-neural\n"
        "  qeebm evaluate --tinyworld data/tinyworld --run runs/sft --rerank     # -> runs/sft/eval/test-rerank.json\n"
        "  qeebm evaluate --tinyworld data/tinyworld --run runs/sft --mbr comet",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g = p.add_argument_group("what to evaluate")
    g.add_argument("--model", help="translator directory or hub id")
    g.add_argument("--run", help="training run directory: its best/ (else final/) model, its seed and config; "
                   "the report goes to RUN/eval/SPLIT.json")
    g.add_argument("--hyps", help="hypothesis file (one a line) instead of translating")
    g.add_argument("--test", help="test corpus with references (tsv/jsonl, columns src and tgt); default: "
                   "TINYWORLD/data/test.tsv, else the run's data.test, else data/tinyworld/data/test.tsv")
    g.add_argument("--tinyworld", metavar="DIR", help="tiny-world preset: --comet DIR/qe/comet --kiwi DIR/qe/kiwi "
                   "--judge judge=DIR/qe/judge --test DIR/data/test.tsv (explicit options win)")
    g = p.add_argument_group("decoding")
    g.add_argument("--src-lang", help="NLLB code (default: the run's, else eng_Latn)")
    g.add_argument("--tgt-lang", help="NLLB code (default: the run's, else khk_Cyrl)")
    add_decoding_args(g)
    add_selection_args(p, "QE and UTILITY: a metric's name (kiwi, comet, a judge's name: its model) or a comet "
                       "directory or hub id. The report names the system SYSTEM+rerank / SYSTEM+mbr and, with "
                       "--run, goes to RUN/eval/SPLIT-rerank.json / SPLIT-mbr.json; a metric whose model did "
                       "the selecting is not held out (selected_on).")
    g = p.add_argument_group("metrics")
    g.add_argument("--metrics", help=f"comma-separated: {','.join(SACREBLEU_METRICS + tuple(DEFAULT_MODELS))} and "
                   "judge names ('judges' = all of them); default: every metric that has a model")
    g.add_argument("--no-neural", action="store_true", help="only BLEU, chrF++ and TER")
    for name, model in DEFAULT_MODELS.items():
        g.add_argument(f"--{name}", metavar="MODEL", help=f"{DESCRIPTIONS[name]} (default {model})")
    g.add_argument("--judge", action="append", metavar="[NAME=]MODEL",
                   help="a held-out QE, scored under NAME (default 'judge'); repeatable")
    for name in (*DEFAULT_MODELS, "judge"):
        g.add_argument(f"--{name}-batch-size", type=int, metavar="N", help="default 16")
    g.add_argument("--bleu-tokenize", metavar="TOK", help="sacrebleu's BLEU tokenizer (13a, intl, char, zh, ja-mecab, "
                   "ko-mecab, ...); default: sacrebleu's for the target language (--tgt-lang, else the run's): zh for "
                   "Chinese, ja-mecab for Japanese, ko-mecab for Korean, 13a otherwise")
    g.add_argument("--qe-precision", choices=["fp16", "fp32"], default="fp16",
                   help="COMET-family models in half precision as comet-score (default), or fp32")
    g.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda when available)")
    g = p.add_argument_group("report")
    g.add_argument("--output", "-o", help="report path (default with --run: RUN/eval/SPLIT.json; else only printed)")
    g.add_argument("--split", default="test", help="report name under RUN/eval/ (default test)")
    g.add_argument("--system", help="system name in the report (default: the run's method, else the model's "
                   "directory name, else the hypothesis file's stem)")
    g.add_argument("--seed", type=int, help="training seed (default: the run's)")
    g.add_argument("--trained-on", default="auto", metavar="METRIC",
                   help="metric the system was optimised against, or none (default: from the run's method "
                   "and qe.path; none without a run)")
    g.add_argument("--heldout", metavar="LIST", help="comma-separated held-out metrics (default: every neural "
                   "metric computed except the trained-on one)")
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("score", help="score (src, mt) pairs with a COMET-family quality estimator",
                       description="Score a TSV/JSONL file with columns src, mt (and ref for reference-based "
                       "COMET) with a CometKiwi / COMET / XCOMET model (hub id or local comet directory).")
    p.add_argument("--model", required=True, help="hub id (online) or local comet model directory")
    p.add_argument("--input", "-i", required=True)
    p.add_argument("--output", "-o", required=True, help="one score a line")
    p.add_argument("--batch-size", type=int, default=64)
    p.set_defaults(func=cmd_score)

    p = sub.add_parser(
        "qe-check", help="will training against this QE help this pair? a report before any GPU time is spent",
        description="Sample K translations and the beam output of each dev source with the translator; score\n"
        "them, the references and degraded copies of the references (doubled, over-long, repeated n-grams,\n"
        "truncated, the source copied, another script, empty) with the QE; report how it ranks the\n"
        "translator's outputs against sentence chrF++ (and --comet), overall and within a source, and what\n"
        "QE reranking gains; which degradations it prefers over the reference and whether the guards catch\n"
        "them; its calibration; with --probe-steps, how far energy-only QE-EBM raises it while chrF++ falls.\n"
        "A verdict with thresholds from the tiny world's measurements (docs/qe-check.md).\n"
        "Writes OUT/qe_check.json, OUT/qe_check.md and plots.",
        epilog="examples:\n"
        "  qeebm qe-check --qe data/tinyworld/qe/kiwi --translator data/tinyworld/nllb-base "
        "--dev data/tinyworld/data/dev.tsv --comet data/tinyworld/qe/comet\n"
        "  qeebm qe-check --qe Unbabel/wmt22-cometkiwi-da --translator facebook/nllb-200-distilled-600M "
        "--dev dev.tsv --tgt-lang khk_Cyrl --comet Unbabel/wmt22-comet-da --probe-steps 40",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--qe", required=True, help="the QE to check: a CometKiwi or XCOMET (scored without references) "
                   "or reference-based COMET; a comet directory or hub id")
    p.add_argument("--translator", required=True, help="translator directory or hub id (NLLB-200 or mBART-50 family)")
    p.add_argument("--dev", required=True, help="dev corpus with references (tsv/jsonl, columns src and tgt)")
    p.add_argument("--src-lang", default="eng_Latn", help="NLLB code (default eng_Latn)")
    p.add_argument("--tgt-lang", default="khk_Cyrl", help="NLLB code (default khk_Cyrl)")
    p.add_argument("--out", default="runs/qe-check", help="report directory (default %(default)s)")
    p.add_argument("--comet", metavar="MODEL", help="a reference-based COMET (or XCOMET) to measure the QE against, "
                   "beside sentence chrF++")
    p.add_argument("--samples", type=int, default=8, metavar="K", help="samples per source (default 8)")
    p.add_argument("--max-sentences", type=int, default=500, metavar="N", help="the first N dev pairs (default 500; "
                   "0: all)")
    p.add_argument("--beams", type=int, default=5, help="beam size of the beam output (default 5)")
    p.add_argument("--max-new-tokens", type=int, default=50, help="default 50")
    p.add_argument("--batch-size", type=int, default=32, help="decoding batch size (default 32)")
    p.add_argument("--qe-batch-size", type=int, default=64, help="QE scoring batch size (default 64)")
    p.add_argument("--seed", type=int, default=0, help="sampling and degradation seed (default 0)")
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda when available)")
    g = p.add_argument_group("hackability probe (off by default)")
    g.add_argument("--probe-steps", type=int, default=0, metavar="N",
                   help="run N steps of energy-only QE-EBM (no CE term, no guards) on the dev sources")
    g.add_argument("--probe-batch", type=int, default=16, help="sources per probe step (default 16)")
    g.add_argument("--probe-samples", type=int, default=5, help="samples per source in the probe (default 5)")
    g.add_argument("--probe-lr", type=float, default=3e-4, help="probe learning rate (default 3e-4)")
    p.set_defaults(func=cmd_qe_check)

    p = sub.add_parser("demo", help="the main job on the tiny world: build it, train, evaluate, print",
                       description="Build the tiny world if absent, train SFT from its base translator to its "
                       "plateau, continue every system from there for the same budget (docs/results.md: "
                       "SFT, the methods trained against the tiny Kiwi, and the positive control trained against "
                       "the true references), evaluate them on its test set (BLEU, chrF++, TER, tiny COMET, tiny "
                       "Kiwi, held-out judge) with the checkpoint selected on dev Kiwi and on dev chrF++, the best "
                       "system also with Kiwi reranking and chrF++ MBR, and print the comparisons against SFT.")
    p.add_argument("--world", help="tiny-world directory, built if absent (default data/tinyworld; "
                   "with --quick data/tinyworld-micro)")
    p.add_argument("--runs", help="where the runs go (default runs/demo; with --quick runs/demo-quick)")
    p.add_argument("--quick", action="store_true", help="a smoke-sized run on the micro world")
    p.add_argument("--seeds", type=int, default=1, choices=[1, 2, 3], help="seeds per method (42, 231, 6)")
    p.add_argument("--steps", type=int, help="continuation steps per system at most (default 400; --quick: 4)")
    p.add_argument("--base", choices=["nllb", "mbart"], default="nllb",
                   help="the base translator SFT's plateau starts from (default nllb: the tiny M2M100)")
    p.add_argument("--systems", help="comma-separated systems, or 'all' (default: the demo's seven: "
                   "sft, qe-ebm-static, reinforce, dpo, qe-ebm-oracle, qe-ebm-softmax-oracle, reinforce-chrf)")
    p.add_argument("--train-plateau", action="store_true",
                   help="train SFT's plateau even where the shipped one (seed 42, the NLLB-style base) is it (11 min)")
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    setup_process()
    args = build_parser().parse_args(argv)
    _setup_logging(args.verbose)
    try:
        args.func(args)
    except QeebmError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
