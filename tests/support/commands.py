"""Commands as a user types them (``bash recipes/en-mn.sh ...``), run from the repository root with
the same interpreter and no hub, each in a process group of its own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from support.runs import REPO

RECIPES = REPO / "recipes"
# The same interpreter for bash's re-execution, and no hub anywhere.
ENV = {**os.environ, "QEEBM_PYTHON": sys.executable, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
       "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}


def run(cmd: list[str], timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """A command in its own process group, killed whole if it outlives ``timeout``."""
    proc = subprocess.Popen(cmd, cwd=REPO, env={**ENV, **(env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"{' '.join(cmd)} did not finish in {timeout} s")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
