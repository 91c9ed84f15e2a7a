"""Tokenizer transfer: SemBridge, Vocabulary Transfer and the appendix-B baselines."""
from __future__ import annotations
