"""A quick look at the language: ``python -m qeebm.tinyworld.language [N] [SEED]`` prints N pairs.
"""

from qeebm.tinyworld.language.sampling import generate_pairs

if __name__ == "__main__":  # a quick look: python -m qeebm.tinyworld.language [N] [SEED]
    import sys

    _n = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    _seed = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    for _p in generate_pairs(_n, _seed):
        print(_p.src)
        print("    " + _p.tgt)
