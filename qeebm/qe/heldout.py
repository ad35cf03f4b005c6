"""Judged held-out rows (src, mt, true quality) and what QE-dynamic measures on them.

A dynamic QE's training loss says little about whether it still ranks translations by quality: the
binary NCE loss can fall by pushing every score down. So QE-EBM (``qe.heldout_path``) scores rows
whose quality is known with the current QE and logs the Pearson and Spearman correlation, and every
QE update logs how often the reference beats the samples (``ref_above_rate``).

File formats (``read_judged``): a TSV file whose header names the columns, among them ``src``,
``mt`` and ``score`` (others, such as ``ref``, are ignored), or a JSONL file of objects with string
``src`` and ``mt`` and a number ``score``. The tiny world writes ``qe/heldout.tsv`` in the TSV form
(``write_judged``): the rows its QEs were held out on.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from qeebm.data.corpus import check_writable, write_atomic
from qeebm.errors import QeebmError
from qeebm.qe.scoring import QEScorer
from qeebm.qe.tiny import pearson, spearman

COLUMNS = ("src", "mt", "score")


def write_judged(path: str | Path, rows, origins: list[str] | None = None) -> Path:
    """(src, mt, ref, quality) rows as a TSV file with the header ``src mt ref score``, and a fifth
    column ``origin`` when ``origins`` are given (where each translation came from)."""

    path = Path(path)
    lines = ["src\tmt\tref\tscore" + ("\torigin" if origins is not None else "")]
    for n, (src, mt, ref, quality) in enumerate(rows, 2):
        for name, text in (("src", src), ("mt", mt), ("ref", ref)):
            check_writable(text, path, f"line {n}'s {name}")
        lines.append(f"{src}\t{mt}\t{ref}\t{float(quality)!r}" + (f"\t{origins[n - 2]}" if origins is not None else ""))
    write_atomic(path, lines)
    return path


def _number(value, path: Path, n: int) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise QeebmError(f"{path}:{n}: 'score' is not a number: {value!r}") from None
    if isinstance(value, bool) or not math.isfinite(x):
        raise QeebmError(f"{path}:{n}: 'score' is not a finite number: {value!r}")
    return x


def read_judged(path: str | Path, max_rows: int = 0) -> tuple[list[str], list[str], list[float]]:
    """(src, mt, score) of the first ``max_rows`` rows (0: all) of a TSV or JSONL file (see the
    module docstring). A missing file, a missing column or a bad row is a one-line error naming the
    file and line."""
    path = Path(path)
    if not path.is_file():
        raise QeebmError(f"qe.heldout_path: no such file: {path}")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise QeebmError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    src: list[str] = []
    mt: list[str] = []
    score: list[float] = []
    jsonl = path.suffix == ".jsonl" or (bool(lines) and lines[0].lstrip().startswith("{"))
    if jsonl:
        numbered = list(enumerate(lines, 1))
    else:
        header = lines[0].split("\t") if lines else []
        missing = [c for c in COLUMNS if c not in header]
        if missing:
            raise QeebmError(f"{path}:1: the header must name the columns {', '.join(COLUMNS)} (tab-separated); "
                             f"missing {', '.join(missing)}")
        where = {c: header.index(c) for c in COLUMNS}
        numbered = list(enumerate(lines[1:], 2))
    for n, line in numbered:
        if max_rows and len(score) >= max_rows:
            break
        if not line.strip():
            continue
        if jsonl:
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise QeebmError(f"{path}:{n}: not JSON ({err.msg})") from None
            if not isinstance(row, dict) or not isinstance(row.get("src"), str) or not isinstance(row.get("mt"), str):
                raise QeebmError(f"{path}:{n}: needs string fields 'src' and 'mt' and a number 'score'")
            if "score" not in row:
                raise QeebmError(f"{path}:{n}: no 'score' field")
            s, m, y = row["src"], row["mt"], row["score"]
        else:
            cells = line.split("\t")
            if len(cells) != len(header):
                raise QeebmError(f"{path}:{n}: expected {len(header)} tab-separated columns "
                                 f"({', '.join(header)}), got {len(cells)}")
            s, m, y = (cells[where[c]] for c in COLUMNS)
        src.append(s)
        mt.append(m)
        score.append(_number(y, path, n))
    if len(score) < 2:
        raise QeebmError(f"{path}: needs at least 2 judged rows for a correlation, found {len(score)}")
    return src, mt, score


def correlations(predicted, true) -> dict[str, float]:
    """Pearson and Spearman correlation of ``predicted`` with ``true`` (nan when one is constant)."""

    return {"pearson": pearson(predicted, true), "spearman": spearman(predicted, true)}


def ref_above_rate(ref: torch.Tensor, samples: torch.Tensor) -> float:
    """Fraction of (reference, sample) pairs whose reference scores strictly above the sample.

    ``ref``: ``[N]``, one per source; ``samples``: ``[N * K]``, the K samples of a source adjacent.
    A sample equal to its reference (a tie) counts as not below it."""
    n = ref.numel()
    if n == 0 or samples.numel() % n:
        raise ValueError(f"{samples.numel()} sample scores for {n} references")
    k = samples.numel() // n
    return (ref.detach().repeat_interleave(k) > samples.detach()).double().mean().item()


class HeldoutProbe:
    """The correlation of a QE's scores with the true quality of judged rows, scored with the fast
    scoring path (``QEScorer``, no cache: the QE changes between measurements)."""

    def __init__(self, path: str | Path, max_rows: int = 0, batch_size: int = 128):
        self.path = Path(path)
        self.src, self.mt, self.true = read_judged(self.path, max_rows)
        self.batch_size = batch_size

    def __len__(self) -> int:
        return len(self.true)

    def measure(self, qe) -> dict[str, float]:
        with torch.random.fork_rng(devices=[]):
            scores = QEScorer(qe, batch_size=self.batch_size, cache=False).score(self.src, self.mt)
        return correlations(scores, self.true)
