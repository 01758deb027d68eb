"""The memo by identity: once per object, by identity not equality, forgotten past its size."""

from __future__ import annotations

from gpuagent.sources.nvlink.memo import ByIdentity


def test_each_object_is_made_once_by_identity_and_all_are_forgotten_past_the_size() -> None:
    made: list[list[int]] = []

    def make(key: list[int]) -> int:
        made.append(key)
        return sum(key)

    memo = ByIdentity(make, kept=2)
    a, b, equal_to_a = [1, 2], [3], [1, 2]
    assert [memo(a), memo(a), memo(b), memo(equal_to_a)] == [3, 3, 3, 3]
    assert [k is equal_to_a for k in made] == [False, False, True]
    # Two were kept when the third came: all went, so the first is made again.
    assert memo(a) == 3 and len(made) == 4
