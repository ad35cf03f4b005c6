"""The metrics the toolkit reports, their labels, display scale and direction: one place for every
table, plot and comparison to read them from."""

from __future__ import annotations

SACREBLEU_METRICS = ("bleu", "chrf", "ter")
# The built-in neural metrics (comet-loadable models) and their default models on the hub, in
# scoring order: evaluation (``MetricSpec.models``), recipes and the CLI's options (``--NAME MODEL``)
# read them here, so a new one is a line in each of these three tables.
DEFAULT_MODELS = {
    "comet": "Unbabel/wmt22-comet-da",
    "kiwi": "Unbabel/wmt22-cometkiwi-da",
    "xcomet": "Unbabel/XCOMET-XL",
}
DESCRIPTIONS = {"comet": "reference-based COMET", "kiwi": "COMET-Kiwi", "xcomet": "XCOMET"}
# How hypotheses may have been chosen among candidates (qeebm/translation/qad.py).
SELECTION_RULES = ("rerank", "mbr")
# Metrics where a smaller number is better; every other metric is higher-is-better.
LOWER_IS_BETTER = frozenset({"ter"})
LABELS = {"bleu": "BLEU", "chrf": "chrF++", "ter": "TER", "comet": "COMET", "xcomet": "XCOMET",
          "kiwi": "Kiwi", "judge": "Judge"}


def label(metric: str) -> str:
    return LABELS.get(metric, metric)


def scale(metric: str) -> float:
    """Display factor: COMET-type scores (0..1) are shown x100, as papers print them."""
    return 1.0 if metric in SACREBLEU_METRICS else 100.0


def higher_is_better(metric: str) -> bool:
    return metric not in LOWER_IS_BETTER


def column(metric: str) -> str:
    name = label(metric)
    if not higher_is_better(metric):
        name += " ↓"
    return name if scale(metric) == 1 else f"{name} ×100"

