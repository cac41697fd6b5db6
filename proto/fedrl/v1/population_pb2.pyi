from fedrl.proto.v1 import federation_pb2 as _federation_pb2
from fedrl.proto.v1 import tensor_pb2 as _tensor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EnrollRequest(_message.Message):
    __slots__ = ("session", "participant_id", "hyperparameters")
    class HyperparametersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    SESSION_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANT_ID_FIELD_NUMBER: _ClassVar[int]
    HYPERPARAMETERS_FIELD_NUMBER: _ClassVar[int]
    session: str
    participant_id: str
    hyperparameters: _containers.ScalarMap[str, float]
    def __init__(self, session: _Optional[str] = ..., participant_id: _Optional[str] = ..., hyperparameters: _Optional[_Mapping[str, float]] = ...) -> None: ...

class MemberAssignment(_message.Message):
    __slots__ = ("generation", "hyperparameters", "adopt", "donor", "donor_generation", "last_report_sequence", "replay_transitions", "keeps_learner")
    class HyperparametersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    HYPERPARAMETERS_FIELD_NUMBER: _ClassVar[int]
    ADOPT_FIELD_NUMBER: _ClassVar[int]
    DONOR_FIELD_NUMBER: _ClassVar[int]
    DONOR_GENERATION_FIELD_NUMBER: _ClassVar[int]
    LAST_REPORT_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    REPLAY_TRANSITIONS_FIELD_NUMBER: _ClassVar[int]
    KEEPS_LEARNER_FIELD_NUMBER: _ClassVar[int]
    generation: int
    hyperparameters: _containers.ScalarMap[str, float]
    adopt: bool
    donor: str
    donor_generation: int
    last_report_sequence: int
    replay_transitions: int
    keeps_learner: bool
    def __init__(self, generation: _Optional[int] = ..., hyperparameters: _Optional[_Mapping[str, float]] = ..., adopt: _Optional[bool] = ..., donor: _Optional[str] = ..., donor_generation: _Optional[int] = ..., last_report_sequence: _Optional[int] = ..., replay_transitions: _Optional[int] = ..., keeps_learner: _Optional[bool] = ...) -> None: ...

class ReportHeader(_message.Message):
    __slots__ = ("session", "participant_id", "spec_hash", "sequence", "generation", "env_steps", "episodes", "score", "tensors", "learner")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANT_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_HASH_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    ENV_STEPS_FIELD_NUMBER: _ClassVar[int]
    EPISODES_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    LEARNER_FIELD_NUMBER: _ClassVar[int]
    session: str
    participant_id: str
    spec_hash: str
    sequence: int
    generation: int
    env_steps: int
    episodes: int
    score: float
    tensors: _tensor_pb2.TensorListHeader
    learner: _tensor_pb2.TensorListHeader
    def __init__(self, session: _Optional[str] = ..., participant_id: _Optional[str] = ..., spec_hash: _Optional[str] = ..., sequence: _Optional[int] = ..., generation: _Optional[int] = ..., env_steps: _Optional[int] = ..., episodes: _Optional[int] = ..., score: _Optional[float] = ..., tensors: _Optional[_Union[_tensor_pb2.TensorListHeader, _Mapping]] = ..., learner: _Optional[_Union[_tensor_pb2.TensorListHeader, _Mapping]] = ...) -> None: ...

class ReportChunk(_message.Message):
    __slots__ = ("header", "chunk", "learner_chunk")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    LEARNER_CHUNK_FIELD_NUMBER: _ClassVar[int]
    header: ReportHeader
    chunk: _tensor_pb2.TensorChunk
    learner_chunk: _tensor_pb2.TensorChunk
    def __init__(self, header: _Optional[_Union[ReportHeader, _Mapping]] = ..., chunk: _Optional[_Union[_tensor_pb2.TensorChunk, _Mapping]] = ..., learner_chunk: _Optional[_Union[_tensor_pb2.TensorChunk, _Mapping]] = ...) -> None: ...

class ReportReply(_message.Message):
    __slots__ = ("sequence", "duplicate", "assignment", "decision", "reason", "goal")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    GOAL_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    duplicate: bool
    assignment: MemberAssignment
    decision: str
    reason: str
    goal: _federation_pb2.GoalState
    def __init__(self, sequence: _Optional[int] = ..., duplicate: _Optional[bool] = ..., assignment: _Optional[_Union[MemberAssignment, _Mapping]] = ..., decision: _Optional[str] = ..., reason: _Optional[str] = ..., goal: _Optional[_Union[_federation_pb2.GoalState, _Mapping]] = ...) -> None: ...

class PullDonorRequest(_message.Message):
    __slots__ = ("session", "participant_id", "generation")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANT_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    session: str
    participant_id: str
    generation: int
    def __init__(self, session: _Optional[str] = ..., participant_id: _Optional[str] = ..., generation: _Optional[int] = ...) -> None: ...

class LearnerHeader(_message.Message):
    __slots__ = ("session", "generation", "present", "tensors")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    PRESENT_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    session: str
    generation: int
    present: bool
    tensors: _tensor_pb2.TensorListHeader
    def __init__(self, session: _Optional[str] = ..., generation: _Optional[int] = ..., present: _Optional[bool] = ..., tensors: _Optional[_Union[_tensor_pb2.TensorListHeader, _Mapping]] = ...) -> None: ...

class LearnerChunk(_message.Message):
    __slots__ = ("header", "chunk")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    header: LearnerHeader
    chunk: _tensor_pb2.TensorChunk
    def __init__(self, header: _Optional[_Union[LearnerHeader, _Mapping]] = ..., chunk: _Optional[_Union[_tensor_pb2.TensorChunk, _Mapping]] = ...) -> None: ...
