"""Whether a claim's candidates read stands for the level-wise locking scan it replaces."""

from orbit.server.store.queries.tasks import locked_candidates


def _rows(*levels_and_locked: tuple[int, bool]) -> list[dict]:
    return [{"id": f"t{i}" if locked else None, "candidate": level}
            for i, (level, locked) in enumerate(levels_and_locked)]


def test_nothing_passed_over_stands_for_the_scan():
    rows, whole = locked_candidates(_rows((5, True), (5, True)), limit=2, wanted=2)
    assert whole and [r["id"] for r in rows] == ["t0", "t1"] and "candidate" not in rows[0]


def test_a_level_short_of_what_it_wants_while_its_range_had_more_does_not():
    _, whole = locked_candidates(_rows((5, False), (5, True)), limit=2, wanted=2)
    assert not whole


def test_a_range_read_to_its_end_does_even_when_a_candidate_was_held():
    rows, whole = locked_candidates(_rows((5, False), (5, True)), limit=3, wanted=2)
    assert whole and [r["id"] for r in rows] == ["t1"]


def test_each_level_is_judged_on_its_own():
    rows = _rows((7, True), (7, True), (3, False), (3, True))
    assert not locked_candidates([dict(r) for r in rows], limit=2, wanted=2)[1]
    assert locked_candidates([dict(r) for r in rows], limit=2, wanted=1)[1]


def test_rows_of_a_plain_scan_stand_for_themselves():
    rows = [{"id": "a"}, {"id": "b"}]
    assert locked_candidates(rows, limit=2, wanted=2) == (rows, True)
    assert locked_candidates([], limit=2, wanted=2) == ([], True)
