"""The main job on the embedded default: ``qeebm demo``.

Builds the tiny world when it is absent, fine-tunes its base translator with each available method
under the same budget, evaluates every system on the tiny world's test set and prints one table.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from qeebm.config import load_config
from qeebm.tinyworld.build import build, is_built

log = logging.getLogger("qeebm.demo")

RECIPE = Path(__file__).resolve().parent.parent / "recipes" / "configs" / "tiny_sft.yaml"


def _world_overrides(world: Path) -> list[str]:
    return [
        f"model.name_or_path={world / 'nllb-base'}",
        f"data.train.path={world / 'data/train.tsv'}",
        f"data.dev.path={world / 'data/dev.tsv'}",
        f"data.test.path={world / 'data/test.tsv'}",
        f"data.mono.path={world / 'data/mono.txt'}",
    ]


def run_demo(world_dir: str = "data/tinyworld", runs_dir: str = "runs/demo", quick: bool = False) -> dict:
    from qeebm.data import read_corpus
    from qeebm.evaluate import corpus_metrics, translate_corpus
    from qeebm.loop import train
    from qeebm.translator import Translator

    start = time.perf_counter()
    world = Path(world_dir)
    if not is_built(world):
        build(world, size="micro" if quick else "default")
    overrides = _world_overrides(world) + [f"output.run_dir={Path(runs_dir) / 'sft'}"]
    if quick:
        overrides += ["optim.max_steps=20", "eval.every=10", "eval.max_examples=16"]
    cfg = load_config(RECIPE, overrides)

    systems = {"base": cfg.model.name_or_path}
    result = train(cfg)
    systems["sft"] = str(result.best_path)

    test = read_corpus(cfg.data.test, "test", need_target=True)
    rows = {}
    for name, path in systems.items():
        cfg.model.name_or_path = path
        hyps = translate_corpus(Translator.load(cfg.model), test.src, cfg.generation)
        rows[name] = corpus_metrics(hyps, test.tgt)
    elapsed = time.perf_counter() - start

    lines = ["| system | BLEU | chrF++ |", "|---|---:|---:|"]
    lines += [f"| {name} | {m['bleu']:.1f} | {m['chrf']:.1f} |" for name, m in rows.items()]
    table = "\n".join(lines)
    print(f"\nTiny world test set ({len(test.src)} segments, beam {cfg.generation.num_beams}):\n")
    print(table)
    print(f"\ntotal time {elapsed:.0f} s")
    out = Path(runs_dir) / "results.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"systems": rows, "seconds": elapsed}, indent=2) + "\n")
    return rows
