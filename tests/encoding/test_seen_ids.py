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


def test_first_seen_many_matches_one_at_a_time(tmp_path):
    """A chunk checked at once gives what checking its ids one by one gives, repeats inside it included."""
    import random

    rng = random.Random(3)
    entries = [(f"d{rng.randrange(1500)}", pos, f"c:{pos}") for pos in range(1, 1901)]  # > one SQL batch, repeats
    one, many = SeenIds(tmp_path / "one.sqlite"), SeenIds(tmp_path / "many.sqlite")
    expected = [one.first_seen(*e) for e in entries]
    got = many.first_seen_many(entries[:700]) + many.first_seen_many(entries[700:])
    assert got == expected and expected.count(None) == len({e[0] for e in entries})
    later = {e[0] for e, first in zip(entries[700:], expected[700:]) if first is None}  # first seen past 700
    assert len(later) > 100
    many.rewind(700)  # rewinding forgets them, as it does for first_seen's ids
    assert many.first_seen_many([(d, 2000, "c:again") for d in sorted(later)]) == [None] * len(later)
    one.close(), many.close()
