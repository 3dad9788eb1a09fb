"""tether.nn: torch.distributed.nn's RemoteModule on tether."""
from tether.nn.api.remote_module import RemoteModule

__all__ = ["RemoteModule"]
