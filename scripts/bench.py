"""Micro-benchmarks, offline: `python scripts/bench.py --what scoring`, `--what step` and `--what preempt`.

step: a few training steps of each method (sft, reinforce, ppo, qe-ebm static and dynamic) in a fresh
process each, every phase timed (qeebm/analysis/benchmark.py: sampling, teacher-forced replay, relaxation and
bridge, alignment, QE forward, backward, optimiser, other), with each phase's FLOP floor at the fp32
matmul rate measured in the same run and the process's peak resident memory during the timed steps;
(a) on the tiny world with its recipes' shapes, (b) on random weights of the published shapes
(NLLB-200-distilled-600M or mbart-large-50 with LoRA, --full adds QE-EBM static with full fine-tuning;
a CometKiwi-22-shaped QE: InfoXLM-large encoder, vocabulary 250,002) at --step-batch labelled pairs
and sources x --samples samples of at most --new-tokens tokens. The real-shape models use the tiny
world's tokenizers; the vocabulary rows beyond them are suppressed at sampling (one index_fill more
per sampled step than a real checkpoint's ~200 special tokens cost).

scoring: segments/s of `QEScorer` against comet's `model.predict(gpus=0)` on the same model and
data, and against the FLOP floor 2 x (encoder parameters without embeddings) x (real, unpadded
tokens) / (fp32 matmul rate measured here), for
  (a) a tiny-world CometKiwi (hidden 64, 2 layers), and
  (b) an XLM-R-base-shaped CometKiwi (12 layers, hidden 768, vocab 250002, random weights).
Embedding rows are a lookup, not a matmul, so they do not count toward the floor; attention's
own score/mix products are left out as well (short segments: a few per cent of the total).
"padded encoder loop" runs the XLM-R model alone on comet's token ids, pre-tokenised, sorted and
padded in batches of --batch-size: what a scorer that calls the encoder on padded batches could
reach on this machine at this moment (the cores may be shared). QEScorer packs each batch's real
tokens instead (qeebm/qe/packed.py), batches of at most --batch-size segments and --max-tokens
padded tokens.
Prints a markdown table. `--n-tiny` / `--n-base` set the sizes (defaults: about 2 minutes).
On cores shared with other jobs, pass `--threads 1`: two OpenMP threads stall at every small op
whenever the other core is busy (tiny-model numbers drop 10-20x), one thread does not.

preempt: how long a preempted run takes from the signal to its checkpoint in place, the time a
launcher's grace must cover (recipes/README.md, "Preemption"). SFT on the tiny world (its nllb-base,
--preempt-accum micro-steps a step), full fine-tuning and LoRA, each in a fresh process: SIGTERM is
raised in the middle of step 3's first micro-step and the loop stops at the next one; timed from the
signal to the loop's stop and to ``checkpoint.save_checkpoint``'s return, median of --preempt-runs
runs. Then ``save_checkpoint`` itself on a model of --save-params fp32 parameters with its AdamW
moments (what a checkpoint holds: weights and two moments, 12 bytes a trained parameter): its bytes
per second here, and at that rate the estimate for mBART-50's checkpoints (LoRA's 2,359,296 adapter
values; full fine-tuning's 610,879,488 parameters).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402


def matmul_gflops(n: int = 2048, reps: int = 5, m: int | None = None, k: int | None = None) -> float:
    """Best-of-reps fp32 rate of a linear layer's product ``[m x k] @ W^T`` with ``W [n x k]``
    (default square ``n``: the roof the floors divide by)."""
    m, k = m or n, k or n
    x, w = torch.randn(m, k), torch.randn(n, k)
    torch.nn.functional.linear(x, w)
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        torch.nn.functional.linear(x, w)
        best = min(best, time.perf_counter() - start)
    return 2 * m * k * n / best / 1e9


# Generation's products at the published shapes, 20 sequences a token (4 sources x 5 samples):
# NLLB-600M's output layer and decoder layers, and the same output layer at wider batches.
GENERATION_SHAPES = [(20, 1024, 256206), (65, 1024, 256206), (500, 1024, 256206),
                     (20, 1024, 4096), (20, 4096, 1024), (20, 1024, 1024)]


def bench_gemm(args) -> None:
    """The fp32 rate of generation's own matrix shapes beside the square rate the floors assume."""
    torch.set_num_threads(args.threads or 1)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), best of 5")
    print(f"  [2048 x 2048] @ W^T, W [2048 x 2048] (the floors' rate): {matmul_gflops():.1f} GFLOP/s")
    for m, k, n in GENERATION_SHAPES:
        print(f"  [{m} x {k}] @ W^T, W [{n} x {k}]: {matmul_gflops(n, m=m, k=k):.1f} GFLOP/s")


def world_segments(n: int, seed: int = 0, k: int = 1) -> tuple[list[str], list[str]]:
    """n tiny-world (source, translation) rows: n // k sources with k candidate translations each,
    clean or corrupted. k = 1: all distinct; k > 1: like the K samples per source that QE-EBM and
    REINFORCE score, where sources and some candidates repeat."""
    from qeebm.tinyworld.language import CORRUPTIONS, corrupt, generate_pairs

    rng = random.Random(seed)
    src, mt = [], []
    for p in generate_pairs(n // k, seed):
        for _ in range(k):
            src.append(p.src)
            mt.append(p.tgt if rng.random() < 0.3 else corrupt(p, rng.choice(CORRUPTIONS), rng))
    return src, mt


def tokenizer(root: Path, seed: int = 0) -> Path:
    from qeebm.tinyworld.language import generate_pairs
    from qeebm.tinyworld.tokenizers import build_xlmr_tokenizer, train_sentencepiece

    texts = [t for p in generate_pairs(3000, seed + 1) for t in (p.src, p.tgt)]
    sp = train_sentencepiece(texts, root / "sp.model", vocab_size=4000, seed=seed)
    build_xlmr_tokenizer(sp, root / "xlmr")
    return root / "xlmr"


def encoder_matmul_params(model) -> int:
    enc = model.encoder.model
    return sum(p.numel() for n, p in enc.named_parameters() if not n.startswith("embeddings."))


def encoder_batches(model, src, mt, batch_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """comet's own model inputs for (src, mt), in batches sorted by length (unique pairs only)."""
    samples = [{"src": s, "mt": m} for s, m in dict.fromkeys(zip(src, mt))]
    rows = []
    for i in range(0, len(samples), 256):
        (x,) = model.prepare_sample(samples[i:i + 256], stage="predict")
        rows += [ids[:n] for ids, n in zip(x["input_ids"], x["attention_mask"].sum(1).tolist())]
    rows.sort(key=len)
    pad = model.encoder.tokenizer.pad_token_id
    out = []
    for i in range(0, len(rows), batch_size):
        ids = torch.nn.utils.rnn.pad_sequence(rows[i:i + batch_size], batch_first=True, padding_value=pad)
        lengths = torch.tensor([len(r) for r in rows[i:i + batch_size]])
        out.append((ids, torch.arange(ids.shape[1])[None, :] < lengths[:, None]))
    return out


def interleaved_best(fns: dict, reps: int) -> dict:
    """Best time of each callable over reps rounds, run in turns: on a shared machine the load
    changes from second to second, and turns give every contender the same chances."""
    best = {k: float("inf") for k in fns}
    for _ in range(reps):
        for k, fn in fns.items():
            start = time.perf_counter()
            out = fn()
            best[k] = min(best[k], out if out is not None else time.perf_counter() - start)
    return best


def bench_scoring(args) -> None:
    from qeebm.evaluation.evaluate import quiet_lightning
    from qeebm.qe.scoring import QEScorer
    from qeebm.qe.tiny import new_qe, write_encoder

    torch.manual_seed(0)
    print(f"batch size {args.batch_size}, QEScorer max_tokens {args.max_tokens}")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, fp32 matmul "
          f"{matmul_gflops():.0f} GFLOP/s (2048^3, best of 5), load average {os.getloadavg()[0]:.1f}")
    tiny = dict(hidden=64, layers=2, heads=4, ffn=128)
    base = dict(hidden=768, layers=12, heads=12, ffn=3072, vocab_size=250002, max_positions=514)
    shapes = {  # name: (encoder shape, segments, samples per source, timing rounds)
        "tiny-world kiwi (h64, 2 layers)": (tiny, args.n_tiny, 1, 3),
        "same, K=4 candidates per source": (tiny, args.n_tiny, 4, 3),
        "XLM-R-base-shaped kiwi (h768, 12 layers, vocab 250002)": (base, args.n_base, 1, 2),
    }
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tok = tokenizer(Path(tmp) / "tok")
        for name, (shape, n, k, reps) in shapes.items():
            enc = write_encoder(Path(tmp) / str(shape["hidden"]), tok, **shape)
            model = new_qe("kiwi", enc, seed=0)
            src, mt = world_segments(n, k=k)
            samples = [{"src": s, "mt": m} for s, m in zip(src, mt)]
            bs = args.batch_size

            def run_predict():
                with quiet_lightning():
                    model.predict(samples, batch_size=bs, gpus=0, progress_bar=False)

            def run_scorer():  # a fresh cache each round: only repeats within the call are saved
                QEScorer(model, batch_size=bs, max_tokens=args.max_tokens).score(src, mt)

            batches = encoder_batches(model, src, mt, bs)

            @torch.inference_mode()
            def run_padded():  # the XLM-R model alone on pre-tokenised sorted padded batches
                for ids, mask in batches:
                    model.encoder.model(input_ids=ids, attention_mask=mask)

            run_predict()  # warm-up
            QEScorer(model, batch_size=bs, max_tokens=args.max_tokens).score(src[:bs], mt[:bs])
            # FLOPs of the distinct pairs the scorer actually encodes
            tokens = sum(int(mask.sum()) for _, mask in batches)
            params = encoder_matmul_params(model)
            flop = 2 * params * tokens
            best = interleaved_best({"scorer": run_scorer, "predict": run_predict, "padded": run_padded,
                                     "floor": lambda: flop / (matmul_gflops(reps=2) * 1e9)}, reps)
            rows.append((name, n, tokens, params, {k: n / t for k, t in best.items()},
                         best["scorer"]))
            model = None  # frees it before the next shape; the closures above are done with it
    print(f"load average after: {os.getloadavg()[0]:.1f}\n")
    print("| QE | segments | encoded tokens | matmul params | predict seg/s | QEScorer seg/s | "
          "QEScorer / predict | padded encoder loop seg/s | FLOP floor seg/s | QEScorer time / floor |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, n, tokens, params, rate, _ in rows:
        print(f"| {name} | {n} | {tokens} | {params / 1e6:.2f}M | {rate['predict']:.1f} | "
              f"{rate['scorer']:.1f} | {rate['scorer'] / rate['predict']:.2f}x | {rate['padded']:.1f} | "
              f"{rate['floor']:.1f} | {rate['floor'] / rate['scorer']:.2f}x |")


# --- step: one training step of each method, decomposed (qeebm/analysis/benchmark.py) -----------------------

STEP_METHODS = ("sft", "reinforce", "ppo", "qe-ebm-static", "qe-ebm-dynamic")
SAMPLING_SECTION = {"reinforce": "reinforce", "ppo": "ppo", "qe-ebm-static": "qe_ebm", "qe-ebm-dynamic": "qe_ebm"}
# Published shapes, random weights: NLLB-200-distilled-600M / mbart-large-50 and CometKiwi-22
# (InfoXLM-large encoder, estimator 3072-1024).
REAL_TRANSLATORS = {"nllb": dict(vocab_size=256206, d_model=1024, layers=12, heads=16, ffn=4096, max_positions=1024),
                    "mbart": dict(vocab_size=250054, d_model=1024, layers=12, heads=16, ffn=4096, max_positions=1024)}
REAL_KIWI = dict(hidden=1024, layers=24, heads=16, ffn=4096, vocab_size=250002, max_positions=514)


def real_world(tiny: Path, out: Path, family: str) -> tuple[Path, Path]:
    """A random-weight translator and CometKiwi of the published shapes, on the tiny world's
    tokenizers (the extra vocabulary rows are never emitted: the step worker suppresses them).
    Written once under ``out`` and reused."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from qeebm.qe.models import save_qe
    from qeebm.qe.tiny import new_qe, write_encoder
    from qeebm.tinyworld.models import tiny_config, tiny_generation_config

    translator, kiwi = out / f"{family}-real", out / "kiwi-real"
    if not (translator / "config.json").is_file():
        shape = dict(REAL_TRANSLATORS[family])
        config = tiny_config(family, vocab_size=shape.pop("vocab_size"), dropout=0.1, **shape)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = AutoModelForSeq2SeqLM.from_config(config)
        model.generation_config = tiny_generation_config(family, config.max_position_embeddings)
        model.save_pretrained(str(translator))
        tok = AutoTokenizer.from_pretrained(str(tiny / "tokenizers" / ("nllb" if family == "nllb" else "mbart50")))
        tok.save_pretrained(str(translator))
        del model
    if not (kiwi / "checkpoints").is_dir():
        enc = write_encoder(kiwi, tiny / "tokenizers" / "xlmr", init_std=0.02, **REAL_KIWI)
        save_qe(new_qe("kiwi", enc, seed=0), kiwi)
    return translator, kiwi


def step_worker(recipe: str, overrides: list[str], threads: int, suppress_unknown: bool) -> dict:
    """Train a few steps in this (fresh) process with every phase timed; returns the summary."""
    import logging

    torch.set_num_threads(threads)
    logging.basicConfig(level=logging.WARNING)
    from qeebm.analysis.benchmark import PhaseTimer, instrument, peak_rss, reset_peak_rss
    from qeebm.config import load_config
    from qeebm.experiments.demo import CONFIGS
    from qeebm.training.loop import train

    if suppress_unknown:
        import functools

        from qeebm.translation.translator import Translator

        special = Translator.suppressed_ids.func

        def suppressed(self):  # the benchmark's models have rows beyond the tiny tokenizer's vocabulary
            return sorted(set(special(self)) | set(range(len(self.tokenizer), self.model.config.vocab_size)))

        Translator.suppressed_ids = functools.cached_property(suppressed)
        Translator.suppressed_ids.__set_name__(Translator, "suppressed_ids")
    timer = PhaseTimer()
    instrument(timer)
    timer.before_step = lambda i: reset_peak_rss() if i == 1 else None
    timer.after_step = lambda: {"peak_rss": peak_rss()}
    cfg = load_config(CONFIGS / recipe, overrides)
    train(cfg)
    summary = timer.summary(skip=1)
    timer.restore()
    return summary


def step_overrides(name: str, world: Path, run_dir: Path, args, translator: Path | None = None,
                   kiwi: Path | None = None, lora: bool = False, checkpointing: bool = False) -> list[str]:
    from qeebm.experiments.demo import run_overrides

    b = {"steps": args.steps + 1, "batch_size": args.step_batch, "every": 0, "patience": 0, "eval_examples": 8}
    out = run_overrides(name, world, run_dir, b, seed=42, start=world / "nllb-base") + ["output.save_every=0",
                                                                                       "eval.max_examples=4"]
    if name in SAMPLING_SECTION:
        section = SAMPLING_SECTION[name]
        out += [f"{section}.sampling.num_samples={args.samples}", f"{section}.sampling.max_new_tokens={args.new_tokens}"]
    if translator is not None:
        out += [f"model.name_or_path={translator}", f"qe.path={kiwi}", "generation.max_new_tokens=8"]
    if lora:
        out += ["model.lora.enabled=true"]
    if checkpointing:
        out += ["model.gradient_checkpointing=true"] + (["qe.gradient_checkpointing=true"] if name.startswith("qe-ebm") else [])
    return out


def bench_step(args) -> None:
    import multiprocessing
    import shutil
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    from qeebm.experiments.demo import tiny_recipe
    from qeebm.tinyworld.build import build
    from qeebm.tinyworld.world import is_built

    world = Path(args.world)
    if not is_built(world):
        build(world)
    rate = matmul_gflops() * 1e9
    print(f"torch {torch.__version__}, {args.threads} thread(s), fp32 matmul {rate / 1e9:.0f} GFLOP/s (2048^3, best "
          f"of 5), load average {os.getloadavg()[0]:.1f}; {args.steps} timed step(s) after 1 warm-up step")
    cases = []  # (label, recipe, overrides, suppress)
    methods = args.methods.split(",")
    tmp = Path(tempfile.mkdtemp(prefix="qeebm-bench-"))
    if "tiny" in args.sizes:
        for name in methods:
            cases.append((f"{name}, tiny world (recipe shapes)", tiny_recipe(name),
                          step_overrides(name, world, tmp / f"tiny-{name}", argparse.Namespace(
                              steps=args.steps, step_batch=16, samples=5, new_tokens=50)), False))
    if "real" in args.sizes:
        translator, kiwi = real_world(world, Path(args.real_dir), args.family)
        for name in methods:
            variants = [(True, False)]
            if name == "qe-ebm-static":  # (LoRA, gradient checkpointing)
                variants += [(True, True)] * args.checkpointing + [(False, False)] * args.full
                variants += [(False, True)] * (args.full and args.checkpointing)
            for lora, ckpt in variants:
                label = (f"{name}, {args.family} 600M-shape + CometKiwi-22-shape, {'LoRA' if lora else 'full'}"
                         + (", checkpointing" if ckpt else ""))
                cases.append((label, tiny_recipe(name), step_overrides(name, world, tmp / f"real-{name}-{lora}-{ckpt}",
                                                                       args, translator, kiwi, lora, ckpt), True))
    rows, failed = [], []
    ctx = multiprocessing.get_context("spawn")
    try:
        for label, recipe, overrides, suppress in cases:
            with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:  # a fresh process: its own peak memory
                try:
                    rows.append((label, pool.submit(step_worker, recipe, overrides, args.threads, suppress).result()))
                except BrokenProcessPool:  # the kernel's OOM killer, as a rule: report it and go on
                    print(f"  {label}: the worker died (killed; on Linux `dmesg` says whether it ran out of memory)",
                          flush=True)
                    failed.append(label)
                    continue
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
            print(f"  {label}: {rows[-1][1]['total']:.2f} s/step", flush=True)
            if args.json:  # each case as it ends: a long real-shape run keeps what it measured if it is stopped
                with open(args.json, "a") as f:
                    f.write(json.dumps({"label": label, "matmul_flops_per_s": rate, **rows[-1][1]}) + "\n")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print_step_table(rows, rate, failed)


def print_step_table(rows: list[tuple[str, dict]], rate: float, failed: list[str] = ()) -> None:
    """The decomposition table and the step-without-generation ratios, from each case's summary."""
    from qeebm.analysis.benchmark import PHASES

    print("\nseconds per step by phase (in brackets: time / FLOP floor at the measured matmul rate)\n")
    print("| method | step s | " + " | ".join(PHASES) + " | overhead share | peak RSS GiB |")
    print("|---|---:|" + "---:|" * len(PHASES) + "---:|---:|")
    for label, r in rows:
        cells = []
        for p in PHASES:
            sec, floor = r["seconds"][p], r["flops"][p] / rate
            cells.append(f"{sec:.3f}" + (f" ({sec / floor:.1f}x)" if floor > 0 else ""))
        overhead = (r["seconds"]["other"] + r["seconds"]["alignment"]) / r["total"]
        print(f"| {label} | {r['total']:.3f} | " + " | ".join(cells) + f" | {overhead:.0%} | {r['peak_rss'] / 2**30:.2f} |")
    print()
    for label, r in rows:
        rest = r["total"] - r["seconds"]["sampling"]
        floor = sum(r["flops"][p] for p in PHASES if p != "sampling") / rate
        if floor > 0:
            print(f"{label}: step without generation {rest:.2f} s = {rest / floor:.1f}x its FLOP floor ({floor:.2f} s)")
    for label in failed:
        print(f"{label}: no measurement, the worker died")


def bench_table(args) -> None:
    """``--what table --json FILE``: the step table again from the cases a ``--json`` run saved."""
    if not args.json:
        raise SystemExit("error: --what table needs --json FILE (written by --what step --json FILE)")
    records = [json.loads(line) for line in Path(args.json).read_text(encoding="utf-8").splitlines() if line.strip()]
    rates = {r["matmul_flops_per_s"] for r in records}
    print(f"{len(records)} case(s) from {args.json}; fp32 matmul {', '.join(f'{x / 1e9:.0f}' for x in sorted(rates))} GFLOP/s")
    for rate in sorted(rates):  # each run's ratios against the rate that run measured
        print_step_table([(r["label"], r) for r in records if r["matmul_flops_per_s"] == rate], rate)


# mBART-50 (mbart-large-50) at its published shape: every parameter, and LoRA's adapters as the
# recipes configure them (r 16 on q_proj and v_proj: 72 matrices x 16 x (1024 + 1024)).
MBART50_PARAMS, MBART50_LORA = 610_879_488, 2_359_296
CHECKPOINT_BYTES_PER_TRAINED = 12  # fp32 weight and AdamW's two moments


def preempt_overrides(world: Path, accum: int, lora: bool) -> list[str]:
    """tiny_sft.yaml's overrides for ``preempt_worker``: the tiny world's SFT from its base, batch 16 as
    ``accum`` micro-steps, no validation and no checkpoint but the preemption's."""
    out = step_overrides("sft", world, Path("unused"), argparse.Namespace(steps=8, step_batch=16, samples=5, new_tokens=50))
    return [o for o in out if not o.startswith("output.run_dir=")] + [
        f"optim.grad_accum={accum}", "eval.at_start=false", "eval.every=0", "output.save_every=0",
        f"model.lora.enabled={str(lora).lower()}"]


def preempt_worker(overrides: list[str], threads: int, signal_at: int, runs: int, root: str) -> dict:
    """In this (fresh) process, ``runs`` times: train until SIGTERM, raised in the middle of micro-step
    ``signal_at`` of the run (counted by backward passes), stops it. Returns the medians of the times
    from the signal to the loop's stop and to the checkpoint in place, the checkpoint's bytes and the
    mean time of a whole step before the signal."""
    import contextlib
    import io
    import logging
    import signal
    import statistics

    torch.set_num_threads(threads)
    logging.disable(logging.WARNING)  # the preemption's own lines, once per run, would split the table
    import qeebm.training.loop
    from qeebm.config import load_config
    from qeebm.experiments.demo import CONFIGS
    from qeebm.training import checkpoint as ckpt

    real_backward, real_save, real_step = qeebm.training.loop.backward, ckpt.save_checkpoint, qeebm.training.loop.train_step
    marks: dict = {}

    def backward(accelerator, loss):
        marks["micro"] += 1
        if marks["micro"] == signal_at:
            marks["signal"] = time.perf_counter()
            signal.raise_signal(signal.SIGTERM)
        real_backward(accelerator, loss)

    def save_checkpoint(*args, **kwargs):
        marks["stop"] = time.perf_counter()
        where = real_save(*args, **kwargs)
        marks["saved"] = time.perf_counter()
        marks["bytes"] = sum(p.stat().st_size for p in where.iterdir())
        return where

    def train_step(*args, **kwargs):
        start = time.perf_counter()
        out = real_step(*args, **kwargs)
        if out is not None:
            marks["steps"].append(time.perf_counter() - start)
        return out

    qeebm.training.loop.backward, ckpt.save_checkpoint, qeebm.training.loop.train_step = backward, save_checkpoint, train_step
    records = []
    try:
        for i in range(runs):
            marks.update(micro=0, steps=[])
            with contextlib.redirect_stdout(io.StringIO()):
                result = qeebm.training.loop.train(load_config(CONFIGS / "tiny_sft.yaml", [*overrides, f"output.run_dir={root}/{i}"]))
            assert result.preempted, "the signal did not stop the run"
            records.append({"stopped_after": result.step, "to_stop": marks["stop"] - marks["signal"],
                            "save": marks["saved"] - marks["stop"], "total": marks["saved"] - marks["signal"],
                            "bytes": marks["bytes"], "step": statistics.mean(marks["steps"][1:] or marks["steps"])})
    finally:
        qeebm.training.loop.backward, ckpt.save_checkpoint, qeebm.training.loop.train_step = real_backward, real_save, real_step
        logging.disable(logging.NOTSET)
    return {k: statistics.median(r[k] for r in records) for k in records[0]}


def save_rate(params: int, root: Path) -> tuple[int, float, float]:
    """Bytes and seconds of ``checkpoint.save_checkpoint`` (write, digests, rename) for a model of
    ``params`` fp32 parameters with AdamW moments, in this process; and the seconds of the digests
    alone, taken again on the files it wrote."""
    from accelerate import Accelerator

    from qeebm.training import checkpoint as ckpt
    from qeebm.utils.integrity import seal

    width = 4096
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(max(1, params // width**2))])
    optimizer = torch.optim.AdamW(model.parameters())
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()  # the moments exist, as in any checkpoint after step 1
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    start = time.perf_counter()
    where = ckpt.save_checkpoint(root, 1, model=model, optimizer=optimizer, scheduler=scheduler, state={"step": 1},
                                 accelerator=Accelerator(cpu=True), keep_last=1)
    seconds = time.perf_counter() - start
    names = [p.name for p in where.iterdir() if p.name != ckpt.STATE]
    start = time.perf_counter()
    seal({}, where, names)
    return sum(p.stat().st_size for p in where.iterdir()), seconds, time.perf_counter() - start


def bench_preempt(args) -> None:
    import multiprocessing
    import shutil
    from concurrent.futures import ProcessPoolExecutor

    from qeebm.tinyworld.build import build
    from qeebm.tinyworld.world import is_built

    world = Path(args.world)
    if not is_built(world):
        build(world)
    accum = args.preempt_accum
    print(f"torch {torch.__version__}, {args.threads} thread(s), load average {os.getloadavg()[0]:.1f}; SFT on the tiny "
          f"world's nllb-base, batch 16 as {accum} micro-steps; SIGTERM in step 3's first micro-step; median of "
          f"{args.preempt_runs} runs\n")
    print("| case | stopped after step | step s | signal -> stop s | save s | signal -> checkpoint s | checkpoint MB |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    tmp = Path(tempfile.mkdtemp(prefix="qeebm-preempt-"))
    ctx = multiprocessing.get_context("spawn")
    try:
        for label, lora in (("full fine-tuning", False), ("LoRA (r 16, q_proj and v_proj)", True)):
            with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
                r = pool.submit(preempt_worker, preempt_overrides(world, accum, lora), args.threads, 2 * accum + 1,
                                args.preempt_runs, str(tmp / ("lora" if lora else "full"))).result()
            print(f"| {label} | {r['stopped_after']:.0f} | {r['step']:.3f} | {r['to_stop']:.3f} | {r['save']:.3f} | "
                  f"{r['total']:.3f} | {r['bytes'] / 1e6:.2f} |", flush=True)
        size, seconds, digest = save_rate(args.save_params, tmp / "rate")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rate = size / seconds
    print(f"\nsave_checkpoint of {size / 1e9:.2f} GB ({args.save_params:,} fp32 parameters with AdamW moments): "
          f"{seconds:.2f} s, {rate / 1e9:.2f} GB/s here (write, sha256 of every file, rename; the sha256 alone, "
          f"of the files as written: {digest:.2f} s)")
    print("mBART-50 at that rate (assumption: the save takes its bytes / the rate above; on a GPU add the copy of "
          "the tensors to host memory, and before the save the rest of the micro-step the signal arrived in):")
    for label, trained in (("LoRA SFT", MBART50_LORA), ("full fine-tuning", MBART50_PARAMS)):
        nbytes = CHECKPOINT_BYTES_PER_TRAINED * trained
        print(f"  {label}: {trained:,} trained parameters x {CHECKPOINT_BYTES_PER_TRAINED} bytes = "
              f"{nbytes / 1e9:.3f} GB -> {nbytes / rate:.2f} s")


BENCHMARKS = {"scoring": bench_scoring, "step": bench_step, "table": bench_table, "gemm": bench_gemm,
              "preempt": bench_preempt}


def main(argv=None) -> None:
    from qeebm.utils.process import setup_process

    setup_process()  # torch's huge-page allocations, as in a `qeebm` command; the step workers inherit it
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--what", choices=sorted(BENCHMARKS), default="scoring")
    parser.add_argument("--n-tiny", type=int, default=1000, help="segments for the tiny QE")
    parser.add_argument("--n-base", type=int, default=96, help="segments for the base-shaped QE")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=2048, help="QEScorer's max_tokens")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's; step: 1)")
    step = parser.add_argument_group("--what step")
    step.add_argument("--methods", default=",".join(STEP_METHODS), help="(default: %(default)s)")
    step.add_argument("--sizes", default="tiny,real", help="tiny (the tiny world's recipes) and/or real (random "
                      "weights of the published shapes, LoRA)")
    step.add_argument("--world", default="data/tinyworld", help="the tiny world (built if absent)")
    step.add_argument("--real-dir", default="runs/bench-real", help="where the real-shape models are written once")
    step.add_argument("--family", default="nllb", choices=["nllb", "mbart"], help="real-shape translator")
    step.add_argument("--full", action="store_true", help="real size: QE-EBM static with full fine-tuning too")
    step.add_argument("--checkpointing", action="store_true",
                      help="real size: QE-EBM static with gradient checkpointing of the translator and the QE too")
    step.add_argument("--steps", type=int, default=3, help="timed steps per method, after one warm-up step")
    step.add_argument("--step-batch", type=int, default=4, help="real size: labelled pairs and sources per step")
    step.add_argument("--samples", type=int, default=5, help="real size: samples per source")
    step.add_argument("--new-tokens", type=int, default=24, help="real size: sampled tokens at most")
    step.add_argument("--json", help="append each case's summary to this JSON-lines file as it ends")
    preempt = parser.add_argument_group("--what preempt (and --world, --threads)")
    preempt.add_argument("--preempt-accum", type=int, default=4, help="micro-steps a step (default: %(default)s, "
                         "the published one-GPU split of 16)")
    preempt.add_argument("--preempt-runs", type=int, default=3, help="preempted runs per case, the median reported")
    preempt.add_argument("--save-params", type=int, default=4 * 4096**2,
                         help="parameters of the model whose checkpoint measures the save rate (default %(default)s: "
                         "0.81 GB written with its AdamW moments)")
    args = parser.parse_args(argv)
    if args.what in ("step", "preempt"):
        args.threads = args.threads or 1
    if args.threads:
        torch.set_num_threads(args.threads)
    BENCHMARKS[args.what](args)


if __name__ == "__main__":
    main()
