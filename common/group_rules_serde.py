"""The session's rules <-> the GroupRules message of protocol v1.

A session's rules travel in every JoinReply (SessionConfig.rules) and live
in the server's state database in this form; a participant's explicit
choices travel in its JoinRequest. Both directions use one message whose
fields all have presence: set means "this value", unset means "the
default" in a session's rules and "not chosen" in a participant's.

The decoders take outside input: any message gives rules, or a DecodeError
(INVALID_ARGUMENT) naming the rule and what it takes, never anything else.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from google.protobuf.message import DecodeError as ProtobufDecodeError

from fedrl.common.errors import DecodeError
from fedrl.common.group_rules import (
    DELTA_DTYPES,
    RULE_NAMES,
    GroupRules,
    RuleChoices,
    RulesError,
)
from fedrl.common.serde import DTYPE_NAMES, wire_dtype
from fedrl.proto.v1 import federation_pb2 as pb


def rules_to_proto(rules: GroupRules) -> pb.GroupRules:
    """Every rule set, except the automatic ones left unset."""
    return _message(dataclasses.asdict(rules))


def choices_to_proto(choices: RuleChoices) -> pb.GroupRules:
    """Only the rules chosen set."""
    return _message(choices.chosen())


def rules_from_proto(message: pb.GroupRules) -> GroupRules:
    """A session's rules; an unset rule takes its default. DecodeError saying why not."""
    try:
        return dataclasses.replace(GroupRules(), **_values(message))
    except RulesError as exc:
        raise DecodeError(f"the session's rules: {exc}") from None


def choices_from_proto(message: pb.GroupRules) -> RuleChoices:
    """A participant's choices: the rules set. DecodeError saying why not."""
    try:
        return dataclasses.replace(RuleChoices(), **_values(message))
    except RulesError as exc:
        raise DecodeError(f"the rules asked for: {exc}") from None


def rules_from_bytes(data: bytes) -> GroupRules:
    """A session's rules from a serialized message (the state database's column)."""
    return rules_from_proto(_parse(data))


def choices_from_bytes(data: bytes) -> RuleChoices:
    """A participant's choices from a serialized message."""
    return choices_from_proto(_parse(data))


def _parse(data: bytes) -> pb.GroupRules:
    try:
        return pb.GroupRules.FromString(data)
    except ProtobufDecodeError as exc:
        raise DecodeError(f"rules that do not parse as a GroupRules message: {exc}") from None


def _message(values: dict[str, Any]) -> pb.GroupRules:
    fields: dict[str, Any] = {name: value for name, value in values.items() if value is not None}
    if "delta_dtype" in fields:
        fields["delta_dtype"] = wire_dtype(str(fields["delta_dtype"]))
    return pb.GroupRules(**fields)


def _values(message: pb.GroupRules) -> dict[str, Any]:
    """The rules the message sets, as Python values (the dataclasses check their ranges)."""
    values: dict[str, Any] = {
        name: getattr(message, name) for name in RULE_NAMES if message.HasField(name)
    }
    if "delta_dtype" in values:
        code = int(message.delta_dtype)
        name = DTYPE_NAMES.get(code)
        if name not in DELTA_DTYPES:
            raise DecodeError(
                f"delta_dtype must be one of {', '.join(DELTA_DTYPES)}, got dtype code {code}"
            )
        values["delta_dtype"] = name
    return values
