"""``qeebm translate`` and ``qeebm evaluate``'s options turned into library calls: the metric spec and
decoding config of an argparse namespace, and ``qeebm evaluate``'s body (a run, a model or a
hypotheses file in; a report out). Everything it computes is qeebm/evaluation/evaluate.py's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Sequence

from qeebm.config import CorpusConfig, GenerationConfig
from qeebm.data.corpus import read_corpus
from qeebm.errors import QeebmError
from qeebm.evaluation.evaluate import (
    JUDGE_NAME,
    QE_METRICS,
    MetricSpec,
    check_qe_models,
    check_trained_on,
    eval_report_path,
    evaluate_system,
    infer_reward_terms,
    infer_trained_on,
    read_hypotheses,
    run_config,
    run_metric_spec,
    run_model_dir,
    run_of_model,
    selection_split,
    selection_system,
    system_name,
    translate_test,
)
from qeebm.evaluation.report import config_id as make_config_id
from qeebm.evaluation.report import write_report
from qeebm.metrics.registry import DEFAULT_MODELS, SACREBLEU_METRICS
from qeebm.metrics.sacrebleu import bleu_tokenizer
from qeebm.translation.qad import check_selection_model, selection_from_args


def _parse_judges(items: Sequence[str]) -> dict[str, str]:
    """``NAME=PATH`` or ``PATH`` (named "judge"); repeatable."""
    judges: dict[str, str] = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not JUDGE_NAME.match(name):
            name, path = "judge", item
        if name in judges:
            raise QeebmError(f"judge '{name}' given twice: name each one, --judge NAME=MODEL")
        judges[name] = path
    return judges


def _split_list(text: Optional[str]) -> Optional[list[str]]:
    if text is None:
        return None
    return [x.strip() for x in text.split(",") if x.strip()]


def generation_from_args(args) -> GenerationConfig:
    """The decoding options ``qeebm translate`` and ``qeebm evaluate`` share (cli.add_decoding_args)."""
    return GenerationConfig(num_beams=args.beams, max_new_tokens=args.max_new_tokens, do_sample=args.sample,
                            temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                            epsilon=args.epsilon, batch_size=args.batch_size)


def metric_spec_from_args(args) -> MetricSpec:
    """The MetricSpec of ``qeebm evaluate``'s options (--tinyworld first, then explicit models)."""
    spec = MetricSpec.tinyworld(args.tinyworld) if args.tinyworld else MetricSpec()
    for name in QE_METRICS:
        if getattr(args, name):
            spec.models[name] = getattr(args, name)
    spec.judges = {**spec.judges, **_parse_judges(args.judge or [])}
    if args.no_neural:
        if args.metrics:
            raise QeebmError("--no-neural and --metrics both choose the metrics: give one of them")
        spec.metrics = list(SACREBLEU_METRICS)
    else:
        spec.metrics = _split_list(args.metrics)
    for name in QE_METRICS + ("judge",):
        size = getattr(args, f"{name}_batch_size")
        if size is not None:
            spec.batch_sizes[name] = size
    spec.precision = args.qe_precision
    spec.device = args.device
    spec.bleu_tokenize = args.bleu_tokenize
    return spec


def evaluate_main(args) -> dict:
    """``qeebm evaluate``: translate (or read) the test set's hypotheses, score them, print the
    corpus scores and write the report (--output, or <run>/eval/<split>.json with --run)."""

    spec = metric_spec_from_args(args)
    names = spec.selected()
    selection = selection_from_args(args, spec.qe_models() | {k: v for k, v in DEFAULT_MODELS.items()
                                                              if k not in spec.qe_models()})

    run = Path(args.run) if args.run else None
    model = args.model
    if run is not None and not args.model and not args.hyps:
        model = str(run_model_dir(run))
    if args.model and args.hyps:
        raise QeebmError("give --model (to translate) or --hyps (translations already made), not both")
    if not model and not args.hyps:
        raise QeebmError("qeebm evaluate needs --model, --run or --hyps")
    if run is None and model:
        run = run_of_model(model)
    config = run_config(run) if run is not None else None
    if args.run and config is None:
        raise QeebmError(f"{run} has no config.yaml: is it a qeebm run directory?")
    spec = run_metric_spec(config, spec)
    model_cfg = (config or {}).get("model") or {}
    # BLEU's tokenizer follows the target language; hypotheses with neither --tgt-lang nor a run have none (13a).
    tgt_lang = args.tgt_lang or model_cfg.get("tgt_lang") or (None if args.hyps else "khk_Cyrl")

    if args.test:
        test_cfg = CorpusConfig(path=args.test)
    elif args.tinyworld:
        test_cfg = CorpusConfig(path=str(Path(args.tinyworld) / "data" / "test.tsv"))
    elif config and (config.get("data") or {}).get("test"):
        test_cfg = CorpusConfig(**config["data"]["test"])
    else:
        test_cfg = CorpusConfig(path="data/tinyworld/data/test.tsv")
    test = read_corpus(test_cfg, "test", need_target=True)
    reward_terms = None
    if args.trained_on == "auto":
        trained_on = infer_trained_on(config, spec)
        reward_terms = infer_reward_terms(config, spec)
    else:
        trained_on = None if args.trained_on in ("none", "") else args.trained_on
    check_trained_on(trained_on, spec)
    check_qe_models(spec, names)  # before decoding: a missing model should cost seconds, not a decode
    if "bleu" in names:
        bleu_tokenizer(tgt_lang, spec.bleu_tokenize)  # likewise a missing tokenizer package
    check_selection_model(selection)

    decoding: dict = {}
    translated = False
    record = None
    if args.hyps:
        if selection is not None:
            raise QeebmError("--rerank and --mbr choose among a model's candidates: give --model or --run, not --hyps")
        hyps = read_hypotheses(args.hyps)
        if len(hyps) != len(test.src):
            raise QeebmError(f"hypotheses {args.hyps} have {len(hyps)} lines but test set {test_cfg.path} has "
                             f"{len(test.src)} segments: the counts must match")
        decoding = {"hyps": str(args.hyps)}
    else:
        hyps, decoding, decode_s, record = translate_test(
            model, args.src_lang or model_cfg.get("src_lang", "eng_Latn"), tgt_lang, test.src,
            generation_from_args(args), spec.device, selection)
        translated = True

    if args.system:
        system = args.system
    elif config is not None:
        system = system_name(config)
    elif model:
        system = Path(model).name or str(model)
    else:
        system = Path(args.hyps).stem
    if not args.system:
        system = selection_system(system, selection)
    heldout = "auto" if args.heldout is None else _split_list(args.heldout)
    seed = args.seed if args.seed is not None else (config or {}).get("seed")

    report = evaluate_system(hyps, test, spec, system=system, seed=seed,
                             config_id=make_config_id(config) if config is not None else None,
                             model=model, decoding=decoding, trained_on=trained_on, heldout=heldout,
                             data_path=test_cfg.path, selection=record, tgt_lang=tgt_lang,
                             reward_terms=reward_terms)
    if translated:
        report["seconds"] = {"decode": round(decode_s, 3), **report["seconds"]}

    split = selection_split(args.split, selection)
    output = Path(args.output) if args.output else (eval_report_path(run, split) if args.run else None)
    summary = {"system": system, "seed": seed, "segments": len(hyps), "corpus": report["corpus"],
               "signatures": report["signatures"]}
    if record is not None:
        summary["cost"] = {"candidates": record["candidates"], "seconds": record["seconds"],
                           "ms_per_segment": record["ms_per_segment"], "selected_on": report["selected_on"]}
    if output is not None:
        write_report(output, report)
        if translated:
            # the hypotheses as a file too, for sacrebleu / comet-score / human eyes
            output.with_suffix(".hyp.txt").write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
        summary["report"] = str(output)
    print(json.dumps(summary, indent=2, ensure_ascii=False))
    return report
