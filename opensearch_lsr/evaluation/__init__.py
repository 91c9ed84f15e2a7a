"""Evaluation: BEIR-layout datasets, IR metrics (ranx), retrieval runs and reports."""
from __future__ import annotations
