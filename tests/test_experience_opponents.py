"""Experience batches of two-player games: each transition's opponent, named, on the wire."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedrl.client.training.experience_conversion import to_experience
from fedrl.client.training.transitions import LearnerTransitions
from fedrl.common.errors import DecodeError
from fedrl.common.experience import (
    ExperienceBatch,
    batch_header,
    decode_batch,
    encode_batch,
)
from tests.support.experience import assert_same_batch, make_batch


def with_opponents(batch: ExperienceBatch, names: tuple[str, ...], seed: int) -> ExperienceBatch:
    rng = np.random.default_rng(seed)
    index = rng.integers(0, len(names), size=len(batch)).astype(np.int32)
    return dataclasses.replace(batch, opponent=index, opponents=names)


def round_trip(batch: ExperienceBatch) -> ExperienceBatch:
    encoded = encode_batch(batch)
    header = batch_header(batch, encoded, session="s", participant_id="p", sequence=1)
    return decode_batch(header, encoded.block, encoded.data)


def test_opponents_travel_with_their_transitions() -> None:
    batch = with_opponents(make_batch(50), ("latest", "lookahead", "version 3"), seed=1)
    got = round_trip(batch)
    assert got.opponents == batch.opponents
    assert_same_batch(
        dataclasses.replace(got, opponent=None), dataclasses.replace(batch, opponent=None)
    )
    assert got.opponent is not None and batch.opponent is not None
    assert [got.opponents[i] for i in got.opponent] == [batch.opponents[i] for i in batch.opponent]
    plain = round_trip(make_batch(5))
    assert plain.opponent is None and plain.opponents == ()


def test_joined_batches_share_one_list_of_names() -> None:
    first = with_opponents(make_batch(10, seed=1), ("random", "latest"), seed=2)
    second = with_opponents(make_batch(10, seed=3), ("latest", "snapshot 40"), seed=4)
    joined = ExperienceBatch.concat([first, second])
    assert joined.opponents == ("random", "latest", "snapshot 40")
    assert joined.opponent is not None
    names = [joined.opponents[i] for i in joined.opponent]
    expected = [b.opponents[i] for b in (first, second) for i in b.opponent]  # type: ignore[union-attr]
    assert names == expected
    with pytest.raises(ValueError, match="two-player"):
        ExperienceBatch.concat([first, make_batch(3)])


def test_a_learner_batch_names_its_opponents_by_league_id() -> None:
    rows = 6
    transitions = LearnerTransitions(
        obs=np.zeros((rows, 4), np.float32),
        action=np.zeros(rows, np.int64),
        reward=np.zeros(rows, np.float32),
        next_obs=np.zeros((rows, 4), np.float32),
        discount=np.ones(rows, np.float32),
        opponent=np.array([0, 7, 2, 7, 0, 0], dtype=np.int64),
    )
    names = {0: "latest", 2: "lookahead", 7: "version 12"}
    batch = to_experience(
        transitions, n_step=1, gamma=0.99, spec_hash="h", opponent_name=names.__getitem__
    )
    assert batch.opponent is not None
    got = [batch.opponents[i] for i in batch.opponent]
    assert got == ["latest", "version 12", "lookahead", "version 12", "latest", "latest"]


def test_a_header_whose_opponents_do_not_fit_its_columns_is_refused() -> None:
    batch = with_opponents(make_batch(8), ("latest", "random"), seed=0)
    encoded = encode_batch(batch)
    header = batch_header(batch, encoded, session="s", participant_id="p", sequence=1)
    cases = []
    nameless = type(header)()
    nameless.CopyFrom(header)
    del nameless.opponents[:]
    cases.append((nameless, "opponent column comes with opponent names"))
    too_few = type(header)()
    too_few.CopyFrom(header)
    del too_few.opponents[1:]
    cases.append((too_few, "names opponent 1 of 1"))
    empty_name = type(header)()
    empty_name.CopyFrom(header)
    empty_name.opponents[0] = ""
    cases.append((empty_name, "printable"))
    for bad, reason in cases:
        with pytest.raises(DecodeError, match=reason):
            decode_batch(bad, encoded.block, encoded.data)
    plain = make_batch(8)
    plain_encoded = encode_batch(plain)
    named = batch_header(plain, plain_encoded, session="s", participant_id="p", sequence=1)
    named.opponents.append("latest")
    with pytest.raises(DecodeError, match="in this order"):
        decode_batch(named, plain_encoded.block, plain_encoded.data)


@settings(max_examples=100, deadline=None)
@given(names=st.lists(st.text(max_size=70), max_size=5), seed=st.integers(0, 2**16))
def test_any_opponent_names_decode_cleanly_or_are_refused(names: list[str], seed: int) -> None:
    batch = make_batch(4, seed=seed)
    good = with_opponents(batch, ("latest",), seed=seed)
    encoded = encode_batch(good)
    header = batch_header(good, encoded, session="s", participant_id="p", sequence=1)
    del header.opponents[:]
    header.opponents.extend(names)
    try:
        got = decode_batch(header, encoded.block, encoded.data)
    except DecodeError:
        return
    assert got.opponent is not None and int(got.opponent.max()) < len(got.opponents)
    assert all(1 <= len(name) <= 64 for name in got.opponents)
