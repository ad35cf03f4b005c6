"""Training methods by name: ``METHODS[cfg.method](cfg, translator, model)``."""

from __future__ import annotations

import difflib

from qeebm.errors import QeebmError
from qeebm.methods.base import Batch, Method, StepOutput
from qeebm.methods.grpo import GRPO
from qeebm.methods.ppo import PPO
from qeebm.methods.preference import CPO, DPO
from qeebm.methods.qe_ebm import QeEbm
from qeebm.methods.qe_finetune import QeFinetune
from qeebm.methods.reinforce import Reinforce
from qeebm.methods.sft import SFT


class _Registry(dict):
    # A plain KeyError would surface as a traceback; a config typo deserves the one-line error.
    def __missing__(self, name):
        match = difflib.get_close_matches(str(name), list(self), n=1, cutoff=0.0)
        hint = f" (did you mean '{match[0]}'?)" if match else ""
        raise QeebmError(f"unknown method '{name}'{hint}; known methods: {', '.join(sorted(self))}")


METHODS: dict[str, type] = _Registry(sft=SFT, reinforce=Reinforce, ppo=PPO, grpo=GRPO, dpo=DPO, cpo=CPO,
                                     **{"qe-ebm": QeEbm, "qe-finetune": QeFinetune})

__all__ = ["METHODS", "Batch", "Method", "StepOutput"]
