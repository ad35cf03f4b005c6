"""Downloading a public parallel corpus and splitting it as the paper did (online only).

The published setup (docs/method.md, "The published setup"): every split filtered to at most 50 translator tokens
per side, the training pairs capped at 200k, 20% of them kept as labelled pairs and the sources of
all of them (the labelled ones included, as the reference code builds its pool) used as the
source-only pool. ``prepare`` writes that as the four files the training loop reads::

    OUT/train.tsv      labelled pairs (src, tgt): 20% of the kept training pairs
    OUT/mono.txt       the source-only pool: every kept training source
    OUT/mono_ref.tsv   the pool's references, for analysis only: no method ever reads them
    OUT/dev.tsv, OUT/test.tsv
    OUT/manifest.json  where it came from, the counts and every file's sha256 (written last)

Only data sets stored as Parquet/JSON load: ``datasets`` >= 4 no longer runs loading scripts. A
script-based repository often still has the hub's automatic Parquet export on the branch
``refs/convert/parquet``; ``HubCorpus.revision`` points there. Before the download the hub client
is asked whether the corpus can be had (``qeebm/utils/hub.py``: proxies from the environment, a limit of
seconds), so no network, a refusing proxy or a gated set fails at once with its cause, instead of
``datasets``' minutes of retries.
"""

from __future__ import annotations

import functools
import html
import json
import logging
import os
import random
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from qeebm.config import SPLIT_FILES
from qeebm.data.corpus import write_lines, write_tsv
from qeebm.errors import QeebmError, first_line
from qeebm.utils import hub
from qeebm.utils.integrity import sha256_file as file_sha256

log = logging.getLogger("qeebm.data.prepare")

PARQUET_EXPORT = "refs/convert/parquet"
# Written last: its presence means the directory is complete.
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class HubCorpus:
    """A parallel corpus on the Hugging Face hub. ``column`` holds either a translation dict
    (``{"en": ..., "mn": ...}``, as OPUS-100 and IWSLT2017 store it) or TED's variable-language form
    (``{"language": [...], "translation": [...]}``); ``src_key``/``tgt_key`` are the language keys in
    it. ``name`` is a config name, ``data_dir`` a folder of the repository (the configs of a Parquet
    export are folders), ``revision`` a branch. ``splits`` maps our split names to the data set's;
    a split the data set lacks is carved out of its training pairs. ``detokenize``: the text is
    stored Moses-tokenized (``It 's``) and each side goes through the Moses detokenizer of its
    language, as fairseq's ML50 builder prepares the TED talks."""

    repo: str
    src_key: str
    tgt_key: str
    column: str = "translation"
    name: Optional[str] = None
    data_dir: Optional[str] = None
    revision: Optional[str] = None
    splits: dict = field(default_factory=lambda: {"train": "train", "dev": "validation", "test": "test"})
    detokenize: bool = False

    def describe(self) -> str:
        where = ", ".join(x for x in (self.name, self.data_dir and f"{self.data_dir}/", self.revision and f"@{self.revision}") if x)
        return f"{self.repo} [{where}] {self.src_key}->{self.tgt_key}" if where else f"{self.repo} {self.src_key}->{self.tgt_key}"


def ted_multi(lang: str) -> HubCorpus:
    """The TED talks corpus of Qi et al. (2018), where ML50's en-{az,bn,ka,mn,mr} pairs come from.
    neulab/ted_multi is script-based; its Parquet export holds one row per talk sentence with every
    language it was translated into, Moses-tokenized: ML50 detokenizes it, and so do we."""
    return HubCorpus("neulab/ted_multi", src_key="en", tgt_key=lang, column="translations",
                     data_dir="plain_text", revision=PARQUET_EXPORT, detokenize=True)


def iwslt2017(lang: str) -> HubCorpus:
    """IWSLT 2017 TED, script-based, via its Parquet export: train; validation = dev2010; test = the
    loading script's test split, tst2010 to tst2015 concatenated (the sets in the 2017 training
    release of the en-de and en-zh pairs), not the campaign's tst2017, which was released apart
    (sacrebleu's ``iwslt17``). Stored as plain text: nothing to detokenize."""
    return HubCorpus("IWSLT/iwslt2017", src_key="en", tgt_key=lang, data_dir=f"iwslt2017-en-{lang}", revision=PARQUET_EXPORT)


def opus100(lang: str) -> HubCorpus:
    """OPUS-100 (native Parquet; configs name the pair alphabetically: az-en, en-mn). Some pairs
    (en-mn) have no dev/test split: those are carved out of the training pairs."""
    return HubCorpus("Helsinki-NLP/opus-100", src_key="en", tgt_key=lang, name="-".join(sorted(("en", lang))))


# ----------------------------------------------------------------------------------------------
# Pure parts (tested offline)


def clean(text: Any, detokenize: Optional[Callable[[list[str]], str]] = None) -> str:
    """One line of text: HTML entities (TED stores ``&apos;``, ``&quot;``) decoded, whitespace runs
    (tabs, line breaks) collapsed, so the TSV files stay well-formed; with ``detokenize``
    (``moses_detokenizer``), its tokens joined back into plain text. Anything else is left as stored."""
    if not isinstance(text, str):
        return ""
    tokens = html.unescape(text).split()
    return " ".join(detokenize(tokens).split()) if detokenize is not None and tokens else " ".join(tokens)


@functools.lru_cache(maxsize=None)
def moses_detokenizer(lang: str) -> Callable[[list[str]], str]:
    """The Moses detokenizer for ``lang`` (sacremoses' port of detokenizer.perl), called on a line's
    tokens as fairseq's ML50 builder calls ``detokenizer.perl -l`` on TED text: with the language's
    first two letters. Entities are decoded before (``clean``), so it is told not to unescape again."""
    from sacremoses import MosesDetokenizer

    detok = MosesDetokenizer(lang=lang[:2])
    return lambda tokens: detok.detokenize(tokens, return_str=True, unescape=False)


def pairs_from_rows(rows: Iterable[Any], corpus: HubCorpus) -> list[tuple[str, str]]:
    """(src, tgt) from the data set's ``column`` values (detokenized where ``corpus.detokenize``);
    rows lacking a side are dropped."""
    src_detok = moses_detokenizer(corpus.src_key) if corpus.detokenize else None
    tgt_detok = moses_detokenizer(corpus.tgt_key) if corpus.detokenize else None
    out = []
    for cell in rows:
        if not isinstance(cell, dict):
            continue
        if "language" in cell and "translation" in cell:
            by_lang = dict(zip(cell["language"] or [], cell["translation"] or []))
        else:
            by_lang = cell
        src, tgt = clean(by_lang.get(corpus.src_key), src_detok), clean(by_lang.get(corpus.tgt_key), tgt_detok)
        # TED marks a sentence missing in one language with __NULL__ instead of leaving it out.
        if src and tgt and "__NULL__" not in src and "__NULL__" not in tgt:
            out.append((src, tgt))
    return out


def dedup(pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return list(dict.fromkeys(pairs))


def carve(pairs: list[tuple[str, str]], size: int, seed: int) -> tuple[list, list]:
    """(held-out ``size`` pairs, the rest), drawn at random; for data sets without a dev/test split."""
    order = list(range(len(pairs)))
    random.Random(seed).shuffle(order)
    held = set(order[:size])
    return [pairs[i] for i in sorted(held)], [p for i, p in enumerate(pairs) if i not in held]


def split_train(pairs: list[tuple[str, str]], cap: int, labelled: float, seed: int) -> tuple[list, list]:
    """Shuffle, keep at most ``cap`` pairs; returns (the first ``labelled`` share of them, all of
    them as the source-only pool). Published: 200k, 20%, and the pool is every training source, the
    labelled ones included, so a method that samples the pool also sees the labelled sources."""
    if not 0 < labelled <= 1:
        raise QeebmError(f"the labelled share must be in (0, 1]; got {labelled}")
    order = list(range(len(pairs)))
    random.Random(seed).shuffle(order)
    kept = [pairs[i] for i in order[:cap]] if cap > 0 else [pairs[i] for i in order]
    n = max(1, round(len(kept) * labelled)) if kept else 0
    return kept[:n], kept


# ----------------------------------------------------------------------------------------------
# Online parts


def offline_error(corpus: HubCorpus, out_dir: Path, why: str = "") -> QeebmError:
    why = why or "the hub is not reachable here (HF_HUB_OFFLINE/HF_DATASETS_OFFLINE is set)"
    return QeebmError(
        f"preparing the data downloads {corpus.describe()} from the Hugging Face hub, but {why}. Run the "
        f"recipe once where it is reachable (--prepare-only does just this step), or copy {out_dir} from a "
        "machine that did; --tiny DIR runs the recipe offline on the tiny world instead")


def check_hub(corpus: HubCorpus, out_dir: Path) -> None:
    """Whether the corpus can be downloaded from here, asked of the hub client (seconds; it honours
    proxies), before ``datasets`` would retry for minutes. A failure names its cause."""

    if hub.offline(datasets=True):
        raise offline_error(corpus, out_dir)
    try:
        hub.check_access(corpus.repo, repo_type="dataset", revision=corpus.revision)
    except QeebmError as err:
        raise offline_error(corpus, out_dir, str(err)) from err


def _load_split(corpus: HubCorpus, split: str, out_dir: Path):
    import datasets

    try:
        return datasets.load_dataset(corpus.repo, corpus.name, data_dir=corpus.data_dir, revision=corpus.revision,
                                     split=split)
    except Exception as err:  # noqa: BLE001 - the hub and datasets raise many types; all end here
        from qeebm.utils import hub

        first = first_line(err)
        # datasets names the splits it found; a missing dev/test split is carved out of train.
        if isinstance(err, ValueError) and "split" in first.lower() and split != corpus.splits["train"]:
            log.info("%s has no split '%s' (%s)", corpus.describe(), split, first)
            return None
        if hub.hub_cause(err) is not None:
            raise QeebmError(f"cannot load {corpus.describe()} split '{split}': "
                             f"{hub.reason(err, corpus.repo, 'dataset')}") from err
        raise QeebmError(
            f"cannot load {corpus.describe()} split '{split}': {type(err).__name__}: {first}. If the hub's layout "
            f"changed, write train.tsv, mono.txt, dev.tsv, test.tsv and a manifest.json into {out_dir} yourself "
            "(recipes/README.md, 'The recipes and their data sets') and run the recipe again") from err


def _token_counter(tokenizer_name: str, src_code: str, tgt_code: str):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_name, src_lang=src_code, tgt_lang=tgt_code)

    def count(texts: list[str], side: str) -> list[int]:
        out: list[int] = []
        for start in range(0, len(texts), 2048):
            chunk = texts[start:start + 2048]
            enc = tok(chunk) if side == "src" else tok(text_target=chunk)
            out.extend(len(ids) for ids in enc["input_ids"])
        return out

    return count


def filter_length(pairs: list[tuple[str, str]], count, max_tokens: int) -> list[tuple[str, str]]:
    if not pairs or max_tokens <= 0 or count is None:
        return pairs
    src_n = count([s for s, _ in pairs], "src")
    tgt_n = count([t for _, t in pairs], "tgt")
    return [p for p, a, b in zip(pairs, src_n, tgt_n) if a <= max_tokens and b <= max_tokens]


def is_prepared(out_dir: str | Path) -> bool:
    return (Path(out_dir) / MANIFEST).is_file()


def check_prepared_text(out: Path, corpus: HubCorpus) -> None:
    """Refuse a directory prepared from the same corpus with the other text form (tokenized TED, as
    written before the Moses detokenization): training on it would silently change what the runs
    and their references are. A manifest of hand-made files (another source) is left alone."""
    try:
        saved = json.loads((out / MANIFEST).read_text(encoding="utf-8")).get("corpus")
    except (OSError, ValueError, AttributeError):
        return
    if not isinstance(saved, dict) or saved.get("repo") != corpus.repo:
        return
    if bool(saved.get("detokenize", False)) != corpus.detokenize:
        form = {True: "detokenized", False: "Moses-tokenized"}
        raise QeebmError(f"{out} holds {form[bool(saved.get('detokenize', False))]} {corpus.repo} text, but this "
                         f"version prepares it {form[corpus.detokenize]} (as ML50 does): move {out} away (and start the "
                         "runs trained on it in another --out) to prepare it again")


def prepare(corpus: HubCorpus, out_dir: str | Path, *, tokenizer: Optional[str], src_code: str, tgt_code: str,
            cap: int = 200_000, labelled: float = 0.2, max_tokens: int = 50, seed: int = 1,
            held_out: int = 2000) -> Path:
    """Download ``corpus`` and write the split files into ``out_dir`` (see the module docstring);
    a finished directory is left alone. ``tokenizer`` (the translator's hub id) counts the tokens
    of the length filter; ``held_out`` caps a dev/test split carved from train (at most a tenth)."""

    out = Path(out_dir)
    if is_prepared(out):
        check_prepared_text(out, corpus)
        log.info("data already prepared in %s", out)
        return out
    check_hub(corpus, out)
    count = _token_counter(tokenizer, src_code, tgt_code) if tokenizer else None
    raw: dict[str, list[tuple[str, str]]] = {}
    for ours, theirs in corpus.splits.items():
        ds = _load_split(corpus, theirs, out)
        if ds is None:
            continue
        if corpus.column not in ds.column_names:
            raise QeebmError(f"{corpus.describe()}[{theirs}]: no column '{corpus.column}' (columns: {', '.join(ds.column_names)})")
        raw[ours] = pairs_from_rows(ds[corpus.column], corpus)
        log.info("%s[%s]: %d pairs with both %s and %s", corpus.repo, theirs, len(raw[ours]), corpus.src_key, corpus.tgt_key)
    if not raw.get("train"):
        raise QeebmError(f"{corpus.describe()}: no training pairs with both '{corpus.src_key}' and '{corpus.tgt_key}'")
    train = dedup(raw["train"])
    carved = []
    for offset, split in enumerate(("dev", "test"), start=1):
        if split not in raw:
            size = min(held_out, len(train) // 10)
            raw[split], train = carve(train, size, seed + offset)
            carved.append(split)
    # Dev and test pairs never reach training, even when the data set repeats them.
    held = {p for split in ("dev", "test") for p in raw[split]}
    train = [p for p in train if p not in held]
    counts = {"downloaded": {k: len(v) for k, v in raw.items()}}
    train = filter_length(train, count, max_tokens)
    splits = {split: filter_length(raw[split], count, max_tokens) for split in ("dev", "test")}
    labelled_pairs, mono_pairs = split_train(train, cap, labelled, seed)

    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    write_tsv(tmp / SPLIT_FILES["train"], [s for s, _ in labelled_pairs], [t for _, t in labelled_pairs])
    write_lines(tmp / SPLIT_FILES["mono"], [s for s, _ in mono_pairs])
    write_tsv(tmp / "mono_ref.tsv", [s for s, _ in mono_pairs], [t for _, t in mono_pairs])
    for split, pairs in splits.items():
        write_tsv(tmp / SPLIT_FILES[split], [s for s, _ in pairs], [t for _, t in pairs])
    counts.update({"train": len(labelled_pairs), "mono": len(mono_pairs), **{k: len(v) for k, v in splits.items()}})
    manifest = {
        "corpus": asdict(corpus),
        "settings": {"cap": cap, "labelled": labelled, "max_tokens": max_tokens, "tokenizer": tokenizer,
                     "src_code": src_code, "tgt_code": tgt_code, "seed": seed, "carved_from_train": carved},
        "counts": counts,
        "files": {p.name: file_sha256(p) for p in sorted(tmp.iterdir())},
    }
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    try:
        os.replace(tmp, out)
    except OSError:
        # Another node's main process (shared file system) finished first with the same files.
        shutil.rmtree(tmp, ignore_errors=True)
        if not is_prepared(out):
            raise
    log.info("data in %s: %s", out, ", ".join(f"{k} {v}" for k, v in counts.items() if k != "downloaded"))
    return out
