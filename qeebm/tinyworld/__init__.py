"""The tiny world: an offline synthetic language pair and the tiny models trained on it."""
