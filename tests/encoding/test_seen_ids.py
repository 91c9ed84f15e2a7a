"""The index job's duplicate-id store: first occurrence wins, across commits, resumes and rewinds."""
from __future__ import annotations

from opensearch_lsr.encoding.job_state import SeenIds


def test_first_occurrence_wins_across_commits_and_reopen(tmp_path):
    db = tmp_path / "seen.sqlite"
    seen = SeenIds(db)
    assert [seen.first_seen(f"d{i}", i, f"c:{i}") for i in range(1, 6)] == [None] * 5
    assert seen.first_seen("d2", 9, "c:9") == "c:2"
    seen.commit()
    assert seen.first_seen("d5", 10, "c:10") == "c:5"
    seen.close()
    again = SeenIds(db)  # a resumed job knows the earlier ids
    assert again.first_seen("d4", 11, "c:11") == "c:4" and again.first_seen("d6", 11, "c:11") is None
    again.rewind(3)  # back to position 3: d4..d6 are forgotten
    assert again.first_seen("d4", 4, "c:4b") is None and again.first_seen("d1", 4, "c:4") == "c:1"
    again.close()
