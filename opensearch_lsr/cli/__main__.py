"""``python -m opensearch_lsr.cli``."""
from __future__ import annotations

from . import main

main()
