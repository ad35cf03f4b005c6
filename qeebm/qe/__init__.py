"""Quality estimators (COMET family): loading and saving (`models`), fast scoring (`scoring`),
regression training (`train`), tiny random/trained stand-ins (`tiny`), the differentiable energy
(`energy`) and the translator-to-QE vocabulary bridge (`bridge`).

Nothing is imported here: importing comet takes seconds, and `qeebm.qe.models.load_qe` must be
able to fail fast before it does.
"""
