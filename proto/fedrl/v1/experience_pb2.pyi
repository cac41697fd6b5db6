from fedrl.proto.v1 import tensor_pb2 as _tensor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ExperienceHeader(_message.Message):
    __slots__ = ("session", "participant_id", "sequence", "env_spec_hash", "transitions", "n_step", "gamma", "cursor", "column_specs", "block", "opponents")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANT_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    ENV_SPEC_HASH_FIELD_NUMBER: _ClassVar[int]
    TRANSITIONS_FIELD_NUMBER: _ClassVar[int]
    N_STEP_FIELD_NUMBER: _ClassVar[int]
    GAMMA_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    COLUMN_SPECS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    OPPONENTS_FIELD_NUMBER: _ClassVar[int]
    session: str
    participant_id: str
    sequence: int
    env_spec_hash: str
    transitions: int
    n_step: int
    gamma: float
    cursor: int
    column_specs: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.TensorSpec]
    block: _tensor_pb2.TensorListHeader
    opponents: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, session: _Optional[str] = ..., participant_id: _Optional[str] = ..., sequence: _Optional[int] = ..., env_spec_hash: _Optional[str] = ..., transitions: _Optional[int] = ..., n_step: _Optional[int] = ..., gamma: _Optional[float] = ..., cursor: _Optional[int] = ..., column_specs: _Optional[_Iterable[_Union[_tensor_pb2.TensorSpec, _Mapping]]] = ..., block: _Optional[_Union[_tensor_pb2.TensorListHeader, _Mapping]] = ..., opponents: _Optional[_Iterable[str]] = ...) -> None: ...

class ExperienceEnd(_message.Message):
    __slots__ = ("next_cursor", "transitions_sent")
    NEXT_CURSOR_FIELD_NUMBER: _ClassVar[int]
    TRANSITIONS_SENT_FIELD_NUMBER: _ClassVar[int]
    next_cursor: int
    transitions_sent: int
    def __init__(self, next_cursor: _Optional[int] = ..., transitions_sent: _Optional[int] = ...) -> None: ...

class ExperienceChunk(_message.Message):
    __slots__ = ("header", "chunk", "end")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    header: ExperienceHeader
    chunk: _tensor_pb2.TensorChunk
    end: ExperienceEnd
    def __init__(self, header: _Optional[_Union[ExperienceHeader, _Mapping]] = ..., chunk: _Optional[_Union[_tensor_pb2.TensorChunk, _Mapping]] = ..., end: _Optional[_Union[ExperienceEnd, _Mapping]] = ...) -> None: ...

class ExperienceAck(_message.Message):
    __slots__ = ("sequence", "duplicate", "transitions_stored")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    TRANSITIONS_STORED_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    duplicate: bool
    transitions_stored: int
    def __init__(self, sequence: _Optional[int] = ..., duplicate: _Optional[bool] = ..., transitions_stored: _Optional[int] = ...) -> None: ...

class PushExperienceReply(_message.Message):
    __slots__ = ("acks",)
    ACKS_FIELD_NUMBER: _ClassVar[int]
    acks: _containers.RepeatedCompositeFieldContainer[ExperienceAck]
    def __init__(self, acks: _Optional[_Iterable[_Union[ExperienceAck, _Mapping]]] = ...) -> None: ...

class PullExperienceRequest(_message.Message):
    __slots__ = ("session", "participant_id", "cursor", "max_transitions", "codec")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANT_ID_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    MAX_TRANSITIONS_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    session: str
    participant_id: str
    cursor: int
    max_transitions: int
    codec: _tensor_pb2.Codec
    def __init__(self, session: _Optional[str] = ..., participant_id: _Optional[str] = ..., cursor: _Optional[int] = ..., max_transitions: _Optional[int] = ..., codec: _Optional[_Union[_tensor_pb2.Codec, str]] = ...) -> None: ...
