"""The session's rules as values: checks, choices, refusals, and their message both ways."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, reject, settings
from hypothesis import strategies as st

from fedrl.common.errors import DecodeError
from fedrl.common.group_rules import (
    AUTOMATIC,
    DELTA_DTYPES,
    LEGACY_RULES,
    MAX_CREDIT,
    RULE_NAMES,
    SHARES,
    GroupRules,
    RuleChoices,
    RulesError,
    described,
    parse_choice,
    refusal,
)
from fedrl.common.group_rules_serde import (
    choices_from_bytes,
    choices_from_proto,
    choices_to_proto,
    rules_from_bytes,
    rules_from_proto,
    rules_to_proto,
)
from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.proto.v1 import tensor_pb2 as tpb

VALUES: dict[str, st.SearchStrategy[Any]] = {
    "share": st.sampled_from(SHARES),
    "sync_interval": st.integers(1, 2**32 - 1),
    "sync_steps": st.integers(1, 2**63 - 1),
    "round_wait_s": st.floats(0.0, 86_400.0),
    "rounds_from": st.integers(1, 2**32 - 1),
    "shared_warmup": st.booleans(),
    "delta_dtype": st.sampled_from(DELTA_DTYPES),
    "foreign_credit": st.floats(0.0, MAX_CREDIT),
    "round_foreign_credit": st.floats(0.0, MAX_CREDIT),
    "credit_at_own_pace": st.booleans(),
}
"""Every value each rule takes (sync_steps above 0: rounds need a length)."""


@st.composite
def choices(draw: st.DrawFn) -> RuleChoices:
    names = draw(st.sets(st.sampled_from(RULE_NAMES)))
    return dataclasses.replace(RuleChoices(), **{name: draw(VALUES[name]) for name in names})


def test_rules_and_choices_name_the_same_rules_and_every_automatic_one_may_be_left_open() -> None:
    assert tuple(f.name for f in dataclasses.fields(RuleChoices)) == RULE_NAMES
    assert set(VALUES) == set(RULE_NAMES)
    assert all(getattr(GroupRules(), name) is None for name in AUTOMATIC)


def test_the_defaults_and_the_rules_of_sessions_from_before_sessions_had_rules() -> None:
    rules = GroupRules()
    legacy = LEGACY_RULES

    assert (rules.share, rules.sync_interval, rules.rounds_from) == ("both", 2, 2)
    assert (rules.sync_steps, rules.round_wait_s, rules.delta_dtype) == (None, None, None)
    assert rules.shared_warmup and rules.credit_at_own_pace
    assert (rules.foreign_credit, rules.round_foreign_credit) == (1.0, 1.0)
    # The clients' defaults of that time: they differ from today's only where they say so.
    assert legacy == dataclasses.replace(
        rules, rounds_from=3, foreign_credit=2.0, round_foreign_credit=4.0
    )


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"share": "all"}, "share must be one of"),
        ({"sync_interval": 0}, "sync_interval must be a whole number in 1"),
        ({"rounds_from": True}, "rounds_from must be a whole number"),
        ({"round_wait_s": float("nan")}, "round_wait_s must be a number in 0"),
        ({"round_wait_s": 1e9}, "round_wait_s must be a number in 0"),
        ({"foreign_credit": float("inf")}, "foreign_credit must be a number in 0"),
        ({"delta_dtype": "int8"}, "delta_dtype must be one of"),
        ({"shared_warmup": 1}, "shared_warmup must be true or false"),
        ({"round_wait_s": 5.0, "share": "experience"}, "--share weights or both"),
        ({"round_wait_s": 5.0, "sync_steps": 0}, "give --sync-steps"),
    ],
)
def test_rules_out_of_range_or_that_cannot_go_together_are_refused_by_name(
    values: dict[str, Any], named: str
) -> None:
    with pytest.raises(RulesError, match=named):
        dataclasses.replace(GroupRules(), **values)


def test_choices_are_checked_one_by_one_and_only_what_was_chosen_counts() -> None:
    with pytest.raises(RulesError, match="rounds_from"):
        RuleChoices(rounds_from=0)
    chosen = RuleChoices(rounds_from=2, shared_warmup=False)

    assert chosen.chosen() == {"rounds_from": 2, "shared_warmup": False}
    assert GroupRules().with_choices(chosen) == GroupRules(rounds_from=2, shared_warmup=False)
    assert chosen.only(["shared_warmup", "share"]) == RuleChoices(shared_warmup=False)
    assert RuleChoices(rounds_from=4).over(chosen) == RuleChoices(
        rounds_from=4, shared_warmup=False
    )


def test_a_refusal_names_the_sessions_value_the_participants_and_the_flag() -> None:
    rules = GroupRules(rounds_from=3, shared_warmup=True)

    message = refusal("pairs", rules, RuleChoices(rounds_from=2))
    both = refusal("pairs", rules, RuleChoices(rounds_from=2, shared_warmup=False, sync_steps=64))

    assert message == (
        "session 'pairs' has --rounds-from 3 (rounds from 3 members pushing), you asked for "
        "--rounds-from 2: drop the flag or join another session"
    )
    assert both is not None
    for part in (
        "--sync-steps automatic",
        "you asked for --sync-steps 64",
        "--shared-warmup (rounds until",
        "you asked for --no-shared-warmup",
        "drop those flags",
    ):
        assert part in both
    assert refusal("pairs", rules, RuleChoices(rounds_from=3)) is None
    assert refusal("pairs", rules, RuleChoices()) is None


def test_every_rule_is_described_with_its_option_value_and_meaning() -> None:
    rows = described(GroupRules(round_wait_s=0.0, credit_at_own_pace=False))

    assert [option for option, _, _ in rows] == [
        "--" + name.replace("_", "-") for name in RULE_NAMES
    ]
    by_option = {option: (value, meaning) for option, value, meaning in rows}
    assert by_option["--round-wait-s"] == ("0", "asynchronous at any size: no rounds")
    assert by_option["--sync-steps"][0] == "auto"
    assert by_option["--credit-at-own-pace"] == ("off", "every received transition earns credit")


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("rounds-from", "2", RuleChoices(rounds_from=2)),
        ("shared_warmup", "off", RuleChoices(shared_warmup=False)),
        ("round-wait-s", "2.5", RuleChoices(round_wait_s=2.5)),
        ("delta-dtype", "float16", RuleChoices(delta_dtype="float16")),
    ],
)
def test_one_rule_parses_from_its_name_and_text(
    name: str, text: str, expected: RuleChoices
) -> None:
    assert parse_choice(name, text) == expected


@pytest.mark.parametrize(
    ("name", "text", "named"),
    [
        ("rounds", "2", "not one of the session's rules"),
        ("rounds-from", "two", "cannot be 'two'"),
        ("shared-warmup", "maybe", "cannot be 'maybe'"),
        ("foreign-credit", "inf", "foreign_credit must be a number"),
    ],
)
def test_a_rule_that_does_not_parse_says_why(name: str, text: str, named: str) -> None:
    with pytest.raises(RulesError, match=named):
        parse_choice(name, text)


@st.composite
def group_rules(draw: st.DrawFn) -> GroupRules:
    try:
        return GroupRules().with_choices(draw(choices()))
    except RulesError:
        reject()


@settings(max_examples=200, deadline=None)
@given(group_rules())
def test_rules_survive_their_message_and_its_bytes(rules: GroupRules) -> None:
    message = rules_to_proto(rules)

    assert rules_from_proto(message) == rules
    assert rules_from_bytes(message.SerializeToString()) == rules
    assert {name for name in RULE_NAMES if message.HasField(name)} == {
        name for name in RULE_NAMES if getattr(rules, name) is not None
    }


@settings(max_examples=200, deadline=None)
@given(choices())
def test_choices_survive_their_message_setting_only_what_was_chosen(chosen: RuleChoices) -> None:
    message = choices_to_proto(chosen)

    assert choices_from_proto(message) == chosen
    assert choices_from_bytes(message.SerializeToString()) == chosen
    assert {name for name in RULE_NAMES if message.HasField(name)} == set(chosen.chosen())


def test_an_empty_message_is_the_default_rules_and_no_choice() -> None:
    assert rules_from_proto(pb.GroupRules()) == GroupRules()
    assert choices_from_proto(pb.GroupRules()) == RuleChoices()


@st.composite
def any_message(draw: st.DrawFn) -> pb.GroupRules:
    """A GroupRules message with any value its wire types can carry in any field."""
    fields: dict[str, Any] = {}
    wire: dict[str, st.SearchStrategy[Any]] = {
        "share": st.text(max_size=12),
        "sync_interval": st.integers(0, 2**32 - 1),
        "sync_steps": st.integers(0, 2**64 - 1),
        "round_wait_s": st.floats(allow_nan=True, allow_infinity=True),
        "rounds_from": st.integers(0, 2**32 - 1),
        "shared_warmup": st.booleans(),
        "delta_dtype": st.integers(-(2**31), 2**31 - 1),
        "foreign_credit": st.floats(allow_nan=True, allow_infinity=True),
        "round_foreign_credit": st.floats(allow_nan=True, allow_infinity=True),
        "credit_at_own_pace": st.booleans(),
    }
    for name in draw(st.sets(st.sampled_from(RULE_NAMES))):
        fields[name] = draw(wire[name])
    return pb.GroupRules(**fields)


@settings(max_examples=300, deadline=None)
@given(any_message())
def test_any_message_decodes_to_rules_or_a_decode_error(message: pb.GroupRules) -> None:
    for decode in (rules_from_proto, choices_from_proto):
        try:
            decoded = decode(message)
        except DecodeError as exc:
            assert str(exc)
        else:
            assert isinstance(decoded, GroupRules | RuleChoices)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_decode_to_rules_or_a_decode_error(data: bytes) -> None:
    for decode in (rules_from_bytes, choices_from_bytes):
        try:
            decoded = decode(data)
        except DecodeError as exc:
            assert str(exc)
        else:
            assert isinstance(decoded, GroupRules | RuleChoices)


def test_a_delta_dtype_no_delta_travels_in_is_refused_by_its_code() -> None:
    with pytest.raises(DecodeError, match="delta_dtype must be one of"):
        rules_from_proto(pb.GroupRules(delta_dtype=tpb.DTYPE_INT64))
    with pytest.raises(DecodeError, match="the rules asked for: rounds_from"):
        choices_from_proto(pb.GroupRules(rounds_from=0))
