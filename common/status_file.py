"""A StatusReply as a JSON file: the server's global_state.json and `fedrl-server status --json`.

The server writes its global state in this form; `fedrl-client plot` reads it
back. A file of the protocol's own message keeps the reader apart from the
server's database: it can be copied to another machine, and it does not
change when the database's layout does.
"""

from __future__ import annotations

from pathlib import Path

from google.protobuf import json_format

from fedrl.proto.v1 import federation_pb2 as pb

ALL_VERSIONS = 2**31 - 1
"""A version count for Status that lists every version: more than any session makes."""


def status_to_json(reply: pb.StatusReply) -> str:
    """The reply as indented JSON, field names as in the .proto and zeros spelled out."""
    return json_format.MessageToJson(
        reply,
        ensure_ascii=False,
        indent=2,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
        unquote_int64_if_possible=True,
    )


def read_status_file(path: Path) -> pb.StatusReply:
    """The StatusReply in a file written by status_to_json; ValueError saying what is wrong."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} cannot be read: {exc}") from None
    try:
        # Fields a newer server added are skipped, so an older reader still plots.
        return json_format.Parse(text, pb.StatusReply(), ignore_unknown_fields=True)
    except json_format.ParseError as exc:
        raise ValueError(
            f"{path} is not a server status (`fedrl-server status --json` writes one): {exc}"
        ) from None
