"""Conversion of other checkpoint formats to ours (MarianMT / OPUS-MT)."""
