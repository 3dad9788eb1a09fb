# Types of tether.rpc's public API (tether/rpc/__init__.py; the classes
# WorkerInfo and RRef are the extension's, python/src/module.cc).
# //python:stubs_test holds them against the package with mypy's stubtest.
import enum
from typing import (Any, Callable, Dict, Generic, Iterable, List, Optional,
                    Tuple, TypeVar, Union, overload)

import torch

from tether.rpc import functions as functions

_T = TypeVar("_T")
_F = TypeVar("_F", bound=Callable[..., Any])

UNSET_RPC_TIMEOUT: float
DEFAULT_RPC_TIMEOUT_SEC: float
DEFAULT_SHUTDOWN_TIMEOUT: float


class RpcTimeoutError(RuntimeError, TimeoutError): ...


class WorkerInfo:
    def __init__(self, name: str, id: int) -> None: ...
    @property
    def name(self) -> str: ...
    @property
    def id(self) -> int: ...
    @property
    def rank(self) -> int: ...
    @property
    def ip(self) -> Optional[str]: ...
    @property
    def port(self) -> Optional[int]: ...


class RRef(Generic[_T]):
    def __init__(self, value: _T) -> None: ...
    def to_here(self, timeout: float = ...) -> _T: ...
    def local_value(self) -> _T: ...
    def owner(self) -> WorkerInfo: ...
    def owner_name(self) -> str: ...
    def is_owner(self) -> bool: ...
    def confirmed_by_owner(self) -> bool: ...
    def backward(self, dist_autograd_ctx_id: int = ...,
                 retain_graph: bool = ...) -> None: ...
    # Proxies: rref.rpc_sync().method(*args) calls the value's method on
    # its owner.
    def rpc_sync(self, timeout: float = ...) -> Any: ...
    def rpc_async(self, timeout: float = ...) -> Any: ...
    def remote(self, timeout: float = ...) -> Any: ...


class BackendType(enum.Enum):
    TENSORPIPE: str
    GRPC: str
    LIBFABRIC: str


class RpcBackendOptions:
    num_worker_threads: int
    rpc_timeout: float
    init_method: str
    backend_settings: Dict[str, str]
    auth_secret: Union[str, bytes, None]
    allowed_modules: Tuple[str, ...]
    program_modules: bool
    init_timeout: float
    busy_poll: float
    spare_core_poll: float

    def __init__(self, num_worker_threads: int = ...,
                 rpc_timeout: float = ..., init_method: str = ...,
                 backend_settings: Optional[Dict[str, str]] = ...,
                 auth_secret: Union[str, bytes, None] = ...,
                 allowed_modules: Iterable[str] = ...,
                 init_timeout: float = ...,
                 device_maps: Optional[Dict[str, Any]] = ...,
                 devices: Optional[List[Any]] = ...,
                 _transports: Optional[List[str]] = ...,
                 _channels: Optional[List[str]] = ...,
                 busy_poll: float = ...,
                 program_modules: bool = ...,
                 spare_core_poll: float = ...) -> None: ...


TensorPipeRpcBackendOptions = RpcBackendOptions

_To = Union[str, int, WorkerInfo]


@overload
def init_rpc(name: str, backend: Union[BackendType, str, None] = ...,
             rank: Optional[int] = ..., world_size: Optional[int] = ...,
             rpc_backend_options: Optional[RpcBackendOptions] = ...,
             master_endpoint: Optional[str] = ...) -> None: ...
# Paddle's positional form: (name, rank, world_size, master_endpoint).
@overload
def init_rpc(name: str, rank: int, world_size: int,
             master_endpoint: Optional[str] = ..., /) -> None: ...
def shutdown(graceful: bool = ..., timeout: float = ...) -> None: ...
def get_worker_info(worker_name: Union[str, int, None] = ...) -> WorkerInfo: ...
def get_current_worker_info() -> WorkerInfo: ...
def get_all_worker_infos() -> List[WorkerInfo]: ...
def get_rpc_timeout() -> float: ...
def enable_gil_profiling(flag: bool) -> None: ...
def rpc_sync(to: _To, func: Callable[..., _T],
             args: Optional[Tuple[Any, ...]] = ...,
             kwargs: Optional[Dict[str, Any]] = ...,
             timeout: float = ...) -> _T: ...
def rpc_async(to: _To, func: Callable[..., _T],
              args: Optional[Tuple[Any, ...]] = ...,
              kwargs: Optional[Dict[str, Any]] = ...,
              timeout: float = ...) -> torch.futures.Future[_T]: ...
def remote(to: _To, func: Callable[..., _T],
           args: Optional[Tuple[Any, ...]] = ...,
           kwargs: Optional[Dict[str, Any]] = ...,
           timeout: float = ...) -> RRef[_T]: ...
def allow_module(name: str) -> None: ...
def expose(fn: _F) -> _F: ...
def add_safe_globals(safe_globals: Iterable[Any]) -> None: ...
def get_safe_globals() -> List[Any]: ...
def clear_safe_globals() -> None: ...
