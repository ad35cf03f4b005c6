"""Corpora: reading and filtering parallel text, preparing a hub data set for a recipe, and the
deterministic order in which training steps draw their examples."""
