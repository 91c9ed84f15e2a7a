"""``python -m opensearch_lsr.cli``."""
from __future__ import annotations

from . import main

if __name__ == "__main__":  # not when a spawned worker process imports the parent's main module
    main()
