"""Micro-benchmarks, offline, on random-weight models: `python scripts/bench.py --what scoring`.

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
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402


def matmul_gflops(n: int = 2048, reps: int = 5) -> float:
    """Best-of-reps fp32 GEMM rate, the roof the encoder's linear layers can reach."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e9


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
    from qeebm.evaluate import quiet_lightning
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
            del model
    print(f"load average after: {os.getloadavg()[0]:.1f}\n")
    print("| QE | segments | encoded tokens | matmul params | predict seg/s | QEScorer seg/s | "
          "QEScorer / predict | padded encoder loop seg/s | FLOP floor seg/s | QEScorer time / floor |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, n, tokens, params, rate, _ in rows:
        print(f"| {name} | {n} | {tokens} | {params / 1e6:.2f}M | {rate['predict']:.1f} | "
              f"{rate['scorer']:.1f} | {rate['scorer'] / rate['predict']:.2f}x | {rate['padded']:.1f} | "
              f"{rate['floor']:.1f} | {rate['floor'] / rate['scorer']:.2f}x |")


BENCHMARKS = {"scoring": bench_scoring}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--what", choices=sorted(BENCHMARKS), default="scoring")
    parser.add_argument("--n-tiny", type=int, default=1000, help="segments for the tiny QE")
    parser.add_argument("--n-base", type=int, default=96, help="segments for the base-shaped QE")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=2048, help="QEScorer's max_tokens")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    BENCHMARKS[args.what](args)


if __name__ == "__main__":
    main()
