"""Where the files the package reads live: the recipes' configs (``recipes/configs``: the tiny
world's ``tiny_*.yaml`` and the real pairs' ``real/*.yaml``) and the tiny world's shipped base
translators and QEs (``data/tinyworld-qe``).

In a checkout (and an editable install) they are those directories beside the package. A built
package (``pip install .``) carries copies as package data, ``qeebm/_configs`` and
``qeebm/_tinyworld_qe`` (pyproject.toml's ``[tool.setuptools.package-dir]``), and never reads the
directory it was built from.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]


def _located(installed: str, checkout: str) -> Path:
    copy = PACKAGE / installed
    return copy if copy.is_dir() else PACKAGE.parent / checkout


CONFIGS = _located("_configs", "recipes/configs")
SHIPPED_QE = _located("_tinyworld_qe", "data/tinyworld-qe")
