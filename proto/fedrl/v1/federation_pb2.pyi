from fedrl.proto.v1 import tensor_pb2 as _tensor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GoalState(_message.Message):
    __slots__ = ("total_episodes", "episodes_done", "reached")
    TOTAL_EPISODES_FIELD_NUMBER: _ClassVar[int]
    EPISODES_DONE_FIELD_NUMBER: _ClassVar[int]
    REACHED_FIELD_NUMBER: _ClassVar[int]
    total_episodes: int
    episodes_done: int
    reached: bool
    def __init__(self, total_episodes: _Optional[int] = ..., episodes_done: _Optional[int] = ..., reached: _Optional[bool] = ...) -> None: ...

class SessionConfig(_message.Message):
    __slots__ = ("max_staleness", "buffer_size", "chunk_bytes", "max_message_bytes", "strategy", "server_learning_rate", "sync_interval", "delta_dtypes", "global_eval_interval", "push_rate_per_s", "pbt_ready_steps", "pbt_quantile", "pbt_resample_probability", "rules")
    MAX_STALENESS_FIELD_NUMBER: _ClassVar[int]
    BUFFER_SIZE_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    SERVER_LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    SYNC_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    DELTA_DTYPES_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_EVAL_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    PUSH_RATE_PER_S_FIELD_NUMBER: _ClassVar[int]
    PBT_READY_STEPS_FIELD_NUMBER: _ClassVar[int]
    PBT_QUANTILE_FIELD_NUMBER: _ClassVar[int]
    PBT_RESAMPLE_PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    RULES_FIELD_NUMBER: _ClassVar[int]
    max_staleness: int
    buffer_size: int
    chunk_bytes: int
    max_message_bytes: int
    strategy: str
    server_learning_rate: float
    sync_interval: int
    delta_dtypes: _containers.RepeatedScalarFieldContainer[_tensor_pb2.DType]
    global_eval_interval: int
    push_rate_per_s: float
    pbt_ready_steps: int
    pbt_quantile: float
    pbt_resample_probability: float
    rules: GroupRules
    def __init__(self, max_staleness: _Optional[int] = ..., buffer_size: _Optional[int] = ..., chunk_bytes: _Optional[int] = ..., max_message_bytes: _Optional[int] = ..., strategy: _Optional[str] = ..., server_learning_rate: _Optional[float] = ..., sync_interval: _Optional[int] = ..., delta_dtypes: _Optional[_Iterable[_Union[_tensor_pb2.DType, str]]] = ..., global_eval_interval: _Optional[int] = ..., push_rate_per_s: _Optional[float] = ..., pbt_ready_steps: _Optional[int] = ..., pbt_quantile: _Optional[float] = ..., pbt_resample_probability: _Optional[float] = ..., rules: _Optional[_Union[GroupRules, _Mapping]] = ...) -> None: ...

class GroupRules(_message.Message):
    __slots__ = ("share", "sync_interval", "sync_steps", "round_wait_s", "rounds_from", "shared_warmup", "delta_dtype", "foreign_credit", "round_foreign_credit", "credit_at_own_pace")
    SHARE_FIELD_NUMBER: _ClassVar[int]
    SYNC_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    SYNC_STEPS_FIELD_NUMBER: _ClassVar[int]
    ROUND_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FROM_FIELD_NUMBER: _ClassVar[int]
    SHARED_WARMUP_FIELD_NUMBER: _ClassVar[int]
    DELTA_DTYPE_FIELD_NUMBER: _ClassVar[int]
    FOREIGN_CREDIT_FIELD_NUMBER: _ClassVar[int]
    ROUND_FOREIGN_CREDIT_FIELD_NUMBER: _ClassVar[int]
    CREDIT_AT_OWN_PACE_FIELD_NUMBER: _ClassVar[int]
    share: str
    sync_interval: int
    sync_steps: int
    round_wait_s: float
    rounds_from: int
    shared_warmup: bool
    delta_dtype: _tensor_pb2.DType
    foreign_credit: float
    round_foreign_credit: float
    credit_at_own_pace: bool
    def __init__(self, share: _Optional[str] = ..., sync_interval: _Optional[int] = ..., sync_steps: _Optional[int] = ..., round_wait_s: _Optional[float] = ..., rounds_from: _Optional[int] = ..., shared_warmup: _Optional[bool] = ..., delta_dtype: _Optional[_Union[_tensor_pb2.DType, str]] = ..., foreign_credit: _Optional[float] = ..., round_foreign_credit: _Optional[float] = ..., credit_at_own_pace: _Optional[bool] = ...) -> None: ...

class JoinRequest(_message.Message):
    __slots__ = ("session", "participant_id", "spec", "spec_hash", "client_version", "mode", "data_source", "synthetic_data", "rules")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANT_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    SPEC_HASH_FIELD_NUMBER: _ClassVar[int]
    CLIENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    DATA_SOURCE_FIELD_NUMBER: _ClassVar[int]
    SYNTHETIC_DATA_FIELD_NUMBER: _ClassVar[int]
    RULES_FIELD_NUMBER: _ClassVar[int]
    session: str
    participant_id: str
    spec: _tensor_pb2.ModelSpec
    spec_hash: str
    client_version: str
    mode: str
    data_source: str
    synthetic_data: bool
    rules: GroupRules
    def __init__(self, session: _Optional[str] = ..., participant_id: _Optional[str] = ..., spec: _Optional[_Union[_tensor_pb2.ModelSpec, _Mapping]] = ..., spec_hash: _Optional[str] = ..., client_version: _Optional[str] = ..., mode: _Optional[str] = ..., data_source: _Optional[str] = ..., synthetic_data: _Optional[bool] = ..., rules: _Optional[_Union[GroupRules, _Mapping]] = ...) -> None: ...

class JoinReply(_message.Message):
    __slots__ = ("config", "current_version", "goal", "server_time_unix_ms", "last_update_sequence", "last_experience_sequence", "spec_hash")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    CURRENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    GOAL_FIELD_NUMBER: _ClassVar[int]
    SERVER_TIME_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_UPDATE_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    LAST_EXPERIENCE_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    SPEC_HASH_FIELD_NUMBER: _ClassVar[int]
    config: SessionConfig
    current_version: int
    goal: GoalState
    server_time_unix_ms: int
    last_update_sequence: int
    last_experience_sequence: int
    spec_hash: str
    def __init__(self, config: _Optional[_Union[SessionConfig, _Mapping]] = ..., current_version: _Optional[int] = ..., goal: _Optional[_Union[GoalState, _Mapping]] = ..., server_time_unix_ms: _Optional[int] = ..., last_update_sequence: _Optional[int] = ..., last_experience_sequence: _Optional[int] = ..., spec_hash: _Optional[str] = ...) -> None: ...

class LeaveRequest(_message.Message):
    __slots__ = ("session", "participant_id", "reason")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANT_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    session: str
    participant_id: str
    reason: str
    def __init__(self, session: _Optional[str] = ..., participant_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class LeaveReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelUploadHeader(_message.Message):
    __slots__ = ("session", "participant_id", "spec_hash", "tensors")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANT_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_HASH_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    session: str
    participant_id: str
    spec_hash: str
    tensors: _tensor_pb2.TensorListHeader
    def __init__(self, session: _Optional[str] = ..., participant_id: _Optional[str] = ..., spec_hash: _Optional[str] = ..., tensors: _Optional[_Union[_tensor_pb2.TensorListHeader, _Mapping]] = ...) -> None: ...

class ModelUpload(_message.Message):
    __slots__ = ("header", "chunk")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    header: ModelUploadHeader
    chunk: _tensor_pb2.TensorChunk
    def __init__(self, header: _Optional[_Union[ModelUploadHeader, _Mapping]] = ..., chunk: _Optional[_Union[_tensor_pb2.TensorChunk, _Mapping]] = ...) -> None: ...

class SeedReply(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: int
    def __init__(self, version: _Optional[int] = ...) -> None: ...

class UpdateMetrics(_message.Message):
    __slots__ = ("mean_return", "eval_return", "base_eval_return", "loss", "evaluated_version")
    MEAN_RETURN_FIELD_NUMBER: _ClassVar[int]
    EVAL_RETURN_FIELD_NUMBER: _ClassVar[int]
    BASE_EVAL_RETURN_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    EVALUATED_VERSION_FIELD_NUMBER: _ClassVar[int]
    mean_return: float
    eval_return: float
    base_eval_return: float
    loss: float
    evaluated_version: int
    def __init__(self, mean_return: _Optional[float] = ..., eval_return: _Optional[float] = ..., base_eval_return: _Optional[float] = ..., loss: _Optional[float] = ..., evaluated_version: _Optional[int] = ...) -> None: ...

class UpdateHeader(_message.Message):
    __slots__ = ("session", "participant_id", "sequence", "base_version", "env_steps", "episodes", "samples", "metrics", "spec_hash", "tensors")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANT_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    BASE_VERSION_FIELD_NUMBER: _ClassVar[int]
    ENV_STEPS_FIELD_NUMBER: _ClassVar[int]
    EPISODES_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    SPEC_HASH_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    session: str
    participant_id: str
    sequence: int
    base_version: int
    env_steps: int
    episodes: int
    samples: int
    metrics: UpdateMetrics
    spec_hash: str
    tensors: _tensor_pb2.TensorListHeader
    def __init__(self, session: _Optional[str] = ..., participant_id: _Optional[str] = ..., sequence: _Optional[int] = ..., base_version: _Optional[int] = ..., env_steps: _Optional[int] = ..., episodes: _Optional[int] = ..., samples: _Optional[int] = ..., metrics: _Optional[_Union[UpdateMetrics, _Mapping]] = ..., spec_hash: _Optional[str] = ..., tensors: _Optional[_Union[_tensor_pb2.TensorListHeader, _Mapping]] = ...) -> None: ...

class UpdateChunk(_message.Message):
    __slots__ = ("header", "chunk")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    header: UpdateHeader
    chunk: _tensor_pb2.TensorChunk
    def __init__(self, header: _Optional[_Union[UpdateHeader, _Mapping]] = ..., chunk: _Optional[_Union[_tensor_pb2.TensorChunk, _Mapping]] = ...) -> None: ...

class PushReply(_message.Message):
    __slots__ = ("sequence", "duplicate", "current_version", "staleness", "weight", "goal")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    CURRENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    STALENESS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    GOAL_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    duplicate: bool
    current_version: int
    staleness: int
    weight: float
    goal: GoalState
    def __init__(self, sequence: _Optional[int] = ..., duplicate: _Optional[bool] = ..., current_version: _Optional[int] = ..., staleness: _Optional[int] = ..., weight: _Optional[float] = ..., goal: _Optional[_Union[GoalState, _Mapping]] = ...) -> None: ...

class PullModelRequest(_message.Message):
    __slots__ = ("session", "participant_id", "version", "have_version", "dtype", "codec")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANT_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    HAVE_VERSION_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    session: str
    participant_id: str
    version: int
    have_version: int
    dtype: _tensor_pb2.DType
    codec: _tensor_pb2.Codec
    def __init__(self, session: _Optional[str] = ..., participant_id: _Optional[str] = ..., version: _Optional[int] = ..., have_version: _Optional[int] = ..., dtype: _Optional[_Union[_tensor_pb2.DType, str]] = ..., codec: _Optional[_Union[_tensor_pb2.Codec, str]] = ...) -> None: ...

class ModelHeader(_message.Message):
    __slots__ = ("session", "version", "is_delta", "from_version", "spec_hash", "tensors", "goal", "applied_sequence")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    IS_DELTA_FIELD_NUMBER: _ClassVar[int]
    FROM_VERSION_FIELD_NUMBER: _ClassVar[int]
    SPEC_HASH_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    GOAL_FIELD_NUMBER: _ClassVar[int]
    APPLIED_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    session: str
    version: int
    is_delta: bool
    from_version: int
    spec_hash: str
    tensors: _tensor_pb2.TensorListHeader
    goal: GoalState
    applied_sequence: int
    def __init__(self, session: _Optional[str] = ..., version: _Optional[int] = ..., is_delta: _Optional[bool] = ..., from_version: _Optional[int] = ..., spec_hash: _Optional[str] = ..., tensors: _Optional[_Union[_tensor_pb2.TensorListHeader, _Mapping]] = ..., goal: _Optional[_Union[GoalState, _Mapping]] = ..., applied_sequence: _Optional[int] = ...) -> None: ...

class ModelChunk(_message.Message):
    __slots__ = ("header", "chunk")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    header: ModelHeader
    chunk: _tensor_pb2.TensorChunk
    def __init__(self, header: _Optional[_Union[ModelHeader, _Mapping]] = ..., chunk: _Optional[_Union[_tensor_pb2.TensorChunk, _Mapping]] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ("session", "max_versions")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    MAX_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    session: str
    max_versions: int
    def __init__(self, session: _Optional[str] = ..., max_versions: _Optional[int] = ...) -> None: ...

class ParticipantState(_message.Message):
    __slots__ = ("participant_id", "first_seen_unix_ms", "last_seen_unix_ms", "status", "episodes", "env_steps", "updates_accepted", "updates_rejected", "updates_duplicate", "experience_batches", "experience_rejected", "best_eval_return", "data_source", "synthetic_data")
    PARTICIPANT_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEEN_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    EPISODES_FIELD_NUMBER: _ClassVar[int]
    ENV_STEPS_FIELD_NUMBER: _ClassVar[int]
    UPDATES_ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    UPDATES_REJECTED_FIELD_NUMBER: _ClassVar[int]
    UPDATES_DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    EXPERIENCE_BATCHES_FIELD_NUMBER: _ClassVar[int]
    EXPERIENCE_REJECTED_FIELD_NUMBER: _ClassVar[int]
    BEST_EVAL_RETURN_FIELD_NUMBER: _ClassVar[int]
    DATA_SOURCE_FIELD_NUMBER: _ClassVar[int]
    SYNTHETIC_DATA_FIELD_NUMBER: _ClassVar[int]
    participant_id: str
    first_seen_unix_ms: int
    last_seen_unix_ms: int
    status: str
    episodes: int
    env_steps: int
    updates_accepted: int
    updates_rejected: int
    updates_duplicate: int
    experience_batches: int
    experience_rejected: int
    best_eval_return: float
    data_source: str
    synthetic_data: bool
    def __init__(self, participant_id: _Optional[str] = ..., first_seen_unix_ms: _Optional[int] = ..., last_seen_unix_ms: _Optional[int] = ..., status: _Optional[str] = ..., episodes: _Optional[int] = ..., env_steps: _Optional[int] = ..., updates_accepted: _Optional[int] = ..., updates_rejected: _Optional[int] = ..., updates_duplicate: _Optional[int] = ..., experience_batches: _Optional[int] = ..., experience_rejected: _Optional[int] = ..., best_eval_return: _Optional[float] = ..., data_source: _Optional[str] = ..., synthetic_data: _Optional[bool] = ...) -> None: ...

class VersionState(_message.Message):
    __slots__ = ("version", "parent", "created_unix_ms", "contributors", "max_staleness", "eval_return", "mean_return", "checkpoint", "env_steps", "rating", "rated_games")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    CONTRIBUTORS_FIELD_NUMBER: _ClassVar[int]
    MAX_STALENESS_FIELD_NUMBER: _ClassVar[int]
    EVAL_RETURN_FIELD_NUMBER: _ClassVar[int]
    MEAN_RETURN_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    ENV_STEPS_FIELD_NUMBER: _ClassVar[int]
    RATING_FIELD_NUMBER: _ClassVar[int]
    RATED_GAMES_FIELD_NUMBER: _ClassVar[int]
    version: int
    parent: int
    created_unix_ms: int
    contributors: _containers.RepeatedScalarFieldContainer[str]
    max_staleness: int
    eval_return: float
    mean_return: float
    checkpoint: str
    env_steps: int
    rating: float
    rated_games: int
    def __init__(self, version: _Optional[int] = ..., parent: _Optional[int] = ..., created_unix_ms: _Optional[int] = ..., contributors: _Optional[_Iterable[str]] = ..., max_staleness: _Optional[int] = ..., eval_return: _Optional[float] = ..., mean_return: _Optional[float] = ..., checkpoint: _Optional[str] = ..., env_steps: _Optional[int] = ..., rating: _Optional[float] = ..., rated_games: _Optional[int] = ...) -> None: ...

class SessionState(_message.Message):
    __slots__ = ("session", "spec_hash", "env_id", "goal", "env_steps", "current_version", "best_eval_return", "best_version", "best_checkpoint", "active_participants", "participants", "versions", "config", "updates_quarantined", "mode", "members", "lineage", "ratings")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    SPEC_HASH_FIELD_NUMBER: _ClassVar[int]
    ENV_ID_FIELD_NUMBER: _ClassVar[int]
    GOAL_FIELD_NUMBER: _ClassVar[int]
    ENV_STEPS_FIELD_NUMBER: _ClassVar[int]
    CURRENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    BEST_EVAL_RETURN_FIELD_NUMBER: _ClassVar[int]
    BEST_VERSION_FIELD_NUMBER: _ClassVar[int]
    BEST_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_PARTICIPANTS_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANTS_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    UPDATES_QUARANTINED_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    LINEAGE_FIELD_NUMBER: _ClassVar[int]
    RATINGS_FIELD_NUMBER: _ClassVar[int]
    session: str
    spec_hash: str
    env_id: str
    goal: GoalState
    env_steps: int
    current_version: int
    best_eval_return: float
    best_version: int
    best_checkpoint: str
    active_participants: int
    participants: _containers.RepeatedCompositeFieldContainer[ParticipantState]
    versions: _containers.RepeatedCompositeFieldContainer[VersionState]
    config: SessionConfig
    updates_quarantined: int
    mode: str
    members: _containers.RepeatedCompositeFieldContainer[MemberState]
    lineage: _containers.RepeatedCompositeFieldContainer[MemberGeneration]
    ratings: _containers.RepeatedCompositeFieldContainer[PlayerRating]
    def __init__(self, session: _Optional[str] = ..., spec_hash: _Optional[str] = ..., env_id: _Optional[str] = ..., goal: _Optional[_Union[GoalState, _Mapping]] = ..., env_steps: _Optional[int] = ..., current_version: _Optional[int] = ..., best_eval_return: _Optional[float] = ..., best_version: _Optional[int] = ..., best_checkpoint: _Optional[str] = ..., active_participants: _Optional[int] = ..., participants: _Optional[_Iterable[_Union[ParticipantState, _Mapping]]] = ..., versions: _Optional[_Iterable[_Union[VersionState, _Mapping]]] = ..., config: _Optional[_Union[SessionConfig, _Mapping]] = ..., updates_quarantined: _Optional[int] = ..., mode: _Optional[str] = ..., members: _Optional[_Iterable[_Union[MemberState, _Mapping]]] = ..., lineage: _Optional[_Iterable[_Union[MemberGeneration, _Mapping]]] = ..., ratings: _Optional[_Iterable[_Union[PlayerRating, _Mapping]]] = ...) -> None: ...

class MemberState(_message.Message):
    __slots__ = ("participant_id", "generation", "hyperparameters", "score", "env_steps", "episodes", "rankings", "checkpoint", "last_report_unix_ms", "adopting")
    class HyperparametersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    PARTICIPANT_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    HYPERPARAMETERS_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    ENV_STEPS_FIELD_NUMBER: _ClassVar[int]
    EPISODES_FIELD_NUMBER: _ClassVar[int]
    RANKINGS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    LAST_REPORT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    ADOPTING_FIELD_NUMBER: _ClassVar[int]
    participant_id: str
    generation: int
    hyperparameters: _containers.ScalarMap[str, float]
    score: float
    env_steps: int
    episodes: int
    rankings: int
    checkpoint: str
    last_report_unix_ms: int
    adopting: bool
    def __init__(self, participant_id: _Optional[str] = ..., generation: _Optional[int] = ..., hyperparameters: _Optional[_Mapping[str, float]] = ..., score: _Optional[float] = ..., env_steps: _Optional[int] = ..., episodes: _Optional[int] = ..., rankings: _Optional[int] = ..., checkpoint: _Optional[str] = ..., last_report_unix_ms: _Optional[int] = ..., adopting: _Optional[bool] = ...) -> None: ...

class MemberGeneration(_message.Message):
    __slots__ = ("participant_id", "generation", "hyperparameters", "donor", "donor_generation", "donor_score", "score", "env_steps", "created_unix_ms", "adopted_unix_ms")
    class HyperparametersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    PARTICIPANT_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    HYPERPARAMETERS_FIELD_NUMBER: _ClassVar[int]
    DONOR_FIELD_NUMBER: _ClassVar[int]
    DONOR_GENERATION_FIELD_NUMBER: _ClassVar[int]
    DONOR_SCORE_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    ENV_STEPS_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    ADOPTED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    participant_id: str
    generation: int
    hyperparameters: _containers.ScalarMap[str, float]
    donor: str
    donor_generation: int
    donor_score: float
    score: float
    env_steps: int
    created_unix_ms: int
    adopted_unix_ms: int
    def __init__(self, participant_id: _Optional[str] = ..., generation: _Optional[int] = ..., hyperparameters: _Optional[_Mapping[str, float]] = ..., donor: _Optional[str] = ..., donor_generation: _Optional[int] = ..., donor_score: _Optional[float] = ..., score: _Optional[float] = ..., env_steps: _Optional[int] = ..., created_unix_ms: _Optional[int] = ..., adopted_unix_ms: _Optional[int] = ...) -> None: ...

class StatusReply(_message.Message):
    __slots__ = ("sessions", "server_time_unix_ms")
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    SERVER_TIME_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    sessions: _containers.RepeatedCompositeFieldContainer[SessionState]
    server_time_unix_ms: int
    def __init__(self, sessions: _Optional[_Iterable[_Union[SessionState, _Mapping]]] = ..., server_time_unix_ms: _Optional[int] = ...) -> None: ...

class GetVersionRequest(_message.Message):
    __slots__ = ("session", "participant_id")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANT_ID_FIELD_NUMBER: _ClassVar[int]
    session: str
    participant_id: str
    def __init__(self, session: _Optional[str] = ..., participant_id: _Optional[str] = ...) -> None: ...

class VersionNotice(_message.Message):
    __slots__ = ("session", "current_version", "goal", "active_participants", "pushing_participants")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    CURRENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    GOAL_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_PARTICIPANTS_FIELD_NUMBER: _ClassVar[int]
    PUSHING_PARTICIPANTS_FIELD_NUMBER: _ClassVar[int]
    session: str
    current_version: int
    goal: GoalState
    active_participants: int
    pushing_participants: int
    def __init__(self, session: _Optional[str] = ..., current_version: _Optional[int] = ..., goal: _Optional[_Union[GoalState, _Mapping]] = ..., active_participants: _Optional[int] = ..., pushing_participants: _Optional[int] = ...) -> None: ...

class PlayerRating(_message.Message):
    __slots__ = ("kind", "name", "version", "rating", "games", "participant_id", "reported_unix_ms")
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RATING_FIELD_NUMBER: _ClassVar[int]
    GAMES_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANT_ID_FIELD_NUMBER: _ClassVar[int]
    REPORTED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    kind: str
    name: str
    version: int
    rating: float
    games: int
    participant_id: str
    reported_unix_ms: int
    def __init__(self, kind: _Optional[str] = ..., name: _Optional[str] = ..., version: _Optional[int] = ..., rating: _Optional[float] = ..., games: _Optional[int] = ..., participant_id: _Optional[str] = ..., reported_unix_ms: _Optional[int] = ...) -> None: ...

class RatingsReport(_message.Message):
    __slots__ = ("session", "participant_id", "ratings")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANT_ID_FIELD_NUMBER: _ClassVar[int]
    RATINGS_FIELD_NUMBER: _ClassVar[int]
    session: str
    participant_id: str
    ratings: _containers.RepeatedCompositeFieldContainer[PlayerRating]
    def __init__(self, session: _Optional[str] = ..., participant_id: _Optional[str] = ..., ratings: _Optional[_Iterable[_Union[PlayerRating, _Mapping]]] = ...) -> None: ...

class RatingsReply(_message.Message):
    __slots__ = ("stored",)
    STORED_FIELD_NUMBER: _ClassVar[int]
    stored: int
    def __init__(self, stored: _Optional[int] = ...) -> None: ...

class RaiseGoalRequest(_message.Message):
    __slots__ = ("session", "participant_id", "total_episodes")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANT_ID_FIELD_NUMBER: _ClassVar[int]
    TOTAL_EPISODES_FIELD_NUMBER: _ClassVar[int]
    session: str
    participant_id: str
    total_episodes: int
    def __init__(self, session: _Optional[str] = ..., participant_id: _Optional[str] = ..., total_episodes: _Optional[int] = ...) -> None: ...
