from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DTYPE_UNSPECIFIED: _ClassVar[DType]
    DTYPE_FLOAT32: _ClassVar[DType]
    DTYPE_FLOAT16: _ClassVar[DType]
    DTYPE_BFLOAT16: _ClassVar[DType]
    DTYPE_INT64: _ClassVar[DType]
    DTYPE_INT32: _ClassVar[DType]
    DTYPE_UINT8: _ClassVar[DType]
    DTYPE_BOOL: _ClassVar[DType]

class Codec(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CODEC_UNSPECIFIED: _ClassVar[Codec]
    CODEC_NONE: _ClassVar[Codec]
    CODEC_ZSTD: _ClassVar[Codec]

class SpaceKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SPACE_KIND_UNSPECIFIED: _ClassVar[SpaceKind]
    SPACE_KIND_BOX: _ClassVar[SpaceKind]
    SPACE_KIND_DISCRETE: _ClassVar[SpaceKind]
DTYPE_UNSPECIFIED: DType
DTYPE_FLOAT32: DType
DTYPE_FLOAT16: DType
DTYPE_BFLOAT16: DType
DTYPE_INT64: DType
DTYPE_INT32: DType
DTYPE_UINT8: DType
DTYPE_BOOL: DType
CODEC_UNSPECIFIED: Codec
CODEC_NONE: Codec
CODEC_ZSTD: Codec
SPACE_KIND_UNSPECIFIED: SpaceKind
SPACE_KIND_BOX: SpaceKind
SPACE_KIND_DISCRETE: SpaceKind

class TensorHeader(_message.Message):
    __slots__ = ("name", "dtype", "shape", "codec", "raw_size", "encoded_size")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    RAW_SIZE_FIELD_NUMBER: _ClassVar[int]
    ENCODED_SIZE_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: DType
    shape: _containers.RepeatedScalarFieldContainer[int]
    codec: Codec
    raw_size: int
    encoded_size: int
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[_Union[DType, str]] = ..., shape: _Optional[_Iterable[int]] = ..., codec: _Optional[_Union[Codec, str]] = ..., raw_size: _Optional[int] = ..., encoded_size: _Optional[int] = ...) -> None: ...

class TensorListHeader(_message.Message):
    __slots__ = ("tensor_count", "total_encoded_size", "total_raw_size")
    TENSOR_COUNT_FIELD_NUMBER: _ClassVar[int]
    TOTAL_ENCODED_SIZE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_RAW_SIZE_FIELD_NUMBER: _ClassVar[int]
    tensor_count: int
    total_encoded_size: int
    total_raw_size: int
    def __init__(self, tensor_count: _Optional[int] = ..., total_encoded_size: _Optional[int] = ..., total_raw_size: _Optional[int] = ...) -> None: ...

class TensorChunk(_message.Message):
    __slots__ = ("index", "header", "data", "last")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    index: int
    header: TensorHeader
    data: bytes
    last: bool
    def __init__(self, index: _Optional[int] = ..., header: _Optional[_Union[TensorHeader, _Mapping]] = ..., data: _Optional[bytes] = ..., last: _Optional[bool] = ...) -> None: ...

class TensorSpec(_message.Message):
    __slots__ = ("name", "dtype", "shape")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: DType
    shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[_Union[DType, str]] = ..., shape: _Optional[_Iterable[int]] = ...) -> None: ...

class SpaceSpec(_message.Message):
    __slots__ = ("kind", "shape", "dtype", "n", "low", "high")
    KIND_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    LOW_FIELD_NUMBER: _ClassVar[int]
    HIGH_FIELD_NUMBER: _ClassVar[int]
    kind: SpaceKind
    shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: DType
    n: int
    low: _containers.RepeatedScalarFieldContainer[float]
    high: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, kind: _Optional[_Union[SpaceKind, str]] = ..., shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[_Union[DType, str]] = ..., n: _Optional[int] = ..., low: _Optional[_Iterable[float]] = ..., high: _Optional[_Iterable[float]] = ...) -> None: ...

class ModelSpec(_message.Message):
    __slots__ = ("tensors", "env_id", "observation_space", "action_space", "algorithm")
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    ENV_ID_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_SPACE_FIELD_NUMBER: _ClassVar[int]
    ACTION_SPACE_FIELD_NUMBER: _ClassVar[int]
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    tensors: _containers.RepeatedCompositeFieldContainer[TensorSpec]
    env_id: str
    observation_space: SpaceSpec
    action_space: SpaceSpec
    algorithm: str
    def __init__(self, tensors: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ..., env_id: _Optional[str] = ..., observation_space: _Optional[_Union[SpaceSpec, _Mapping]] = ..., action_space: _Optional[_Union[SpaceSpec, _Mapping]] = ..., algorithm: _Optional[str] = ...) -> None: ...
