"""A real Lucene (Java 11+ and the Lucene 8 jars of Debian's ``liblucene8-java``, or ``LUCENE_JARS``) as ground
truth; every test here is marked ``lucene`` and skipped in one line where Java or the jars are missing."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))


def pytest_collection_modifyitems(config, items):
    for item in items:
        if Path(str(item.fspath)).parent == Path(__file__).parent:
            item.add_marker(pytest.mark.lucene)


@pytest.fixture(scope="session")
def lucene():
    from lucene_runner import Lucene, unavailable

    why = unavailable()
    if why:
        pytest.skip(f"real-Lucene checks {why}")
    return Lucene()
