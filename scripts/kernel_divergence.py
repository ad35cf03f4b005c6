"""Where two CPU kernel sets make one tiny-world run take different paths.

    python scripts/kernel_divergence.py --system reinforce-oracle --steps 4
    python scripts/kernel_divergence.py --system sft --steps 20

Trains ``--system`` from the tiny world's shipped seed-42 plateau for ``--steps`` steps (the demo's
recipe, one thread) once per value of ``ATEN_CPU_CAPABILITY`` (torch's vectorised kernels: default,
avx2, avx512; each a fresh process, since torch reads it at start), logging every step, and prints
each step's logged numbers side by side with the first step at which they differ. It stands in for
running the same command on two CPUs: a sampled run whose samples differ at step 1 under two
kernel sets of one machine will not reproduce across machines whose kernels differ. Needs a built
tiny world (``qeebm tinyworld build data/tinyworld``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

# What one process runs: the demo's overrides for the system, from the shipped plateau.
WORKER = """
import sys, torch
from pathlib import Path
torch.set_num_threads(1)
from qeebm.config import load_config
from qeebm.experiments.demo import CONFIGS, SHIPPED_PLATEAU, budget, run_overrides, tiny_recipe
from qeebm.training.loop import train
name, world, out, steps = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
b = budget(False) | {"steps": steps, "every": steps + 1}
overrides = run_overrides(name, world, out, b, 42, SHIPPED_PLATEAU / "best")
overrides += ["eval.at_start=false", "logging.every=1", f"output.save_every={steps + 1}"]
train(load_config(CONFIGS / tiny_recipe(name), overrides))
"""


def run(system: str, world: str, steps: int, capability: str, out: Path) -> list[dict]:
    env = dict(os.environ, ATEN_CPU_CAPABILITY=capability, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    subprocess.run([sys.executable, "-c", WORKER, system, world, str(out), str(steps)], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if isinstance(v, (int, float)) and "seconds" not in k and k != "elapsed"}
            for r in records if "loss" in r]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--system", default="reinforce-oracle", help="a tiny-world system (default %(default)s)")
    p.add_argument("--world", default="data/tinyworld", help="a built tiny world (default %(default)s)")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--capabilities", default="avx2,avx512",
                   help="ATEN_CPU_CAPABILITY values to compare (default %(default)s; 'default' is scalar code)")
    p.add_argument("--keys", default="loss,grad_norm",
                   help="logged numbers to print (default %(default)s; every one is compared)")
    args = p.parse_args(argv)
    caps = [c.strip() for c in args.capabilities.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        logs = {c: run(args.system, args.world, args.steps, c, Path(tmp) / c) for c in caps}
    keys = [k.strip() for k in args.keys.split(",")]
    print(f"{args.system}, {args.steps} steps from the shipped plateau; " + ", ".join(keys) + " per kernel set")
    first = None
    for i, records in enumerate(zip(*logs.values())):
        same = all(r == records[0] for r in records[1:])
        if not same and first is None:
            first = records[0]["step"]
        cells = " | ".join(", ".join(repr(r.get(k)) for k in keys) for r in records)
        print(f"step {records[0]['step']}: {cells}{'' if same else '   <- differs'}")
    print(f"every logged number equal in all {args.steps} steps" if first is None else f"first difference at step {first}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
