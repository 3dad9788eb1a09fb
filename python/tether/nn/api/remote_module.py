"""RemoteModule, as the peer's torch.distributed.nn.api.remote_module:
an nn.Module created on another worker and used from here.

    from tether.nn.api.remote_module import RemoteModule

    remote_linear = RemoteModule("worker1/cpu", nn.Linear, args=(20, 30))
    out = remote_linear(torch.randn(128, 20))          # forward on worker1
    fut = remote_linear.forward_async(torch.randn(128, 20))
    params = remote_linear.remote_parameters()         # RRefs, for the
                                                       # DistributedOptimizer

``module_cls`` travels by reference like any function (docs/security.md):
the owner must allow it (its __main__, the program's own modules, an
allowed module, @expose, or a torch.nn module class). A RemoteModule
passed to another worker travels as a reference to the same module. CPU only: the
device part of ``remote_device`` must be ``cpu``. TorchScript module
interfaces (``_module_interface_cls``) are not supported.
"""
import torch.nn as nn

import tether.rpc as rpc

__all__ = ["RemoteModule"]


def _parse_remote_device(remote_device):
    """'<worker>/<device>', 'rank:<rank>/<device>' or '<worker>' -> (to,
    device), as the peer's torch.distributed.remote_device reads it."""
    error = ("Could not parse remote_device: %s. The valid format is "
             "'<workername>/<device>' or 'rank:<rank>/<device>'"
             % (remote_device,))
    if not isinstance(remote_device, str):
        raise TypeError("Invalid type for remote_device: %s"
                        % type(remote_device))
    fields = remote_device.split("/")
    if len(fields) == 1:
        worker, device = fields[0], "cpu"
    elif len(fields) == 2:
        worker, device = fields
    else:
        raise ValueError(error)
    if not worker or not device:
        raise ValueError(error)
    if device != "cpu":
        raise ValueError("RemoteModule on tether runs on the owner's CPU; "
                         "remote_device %r names device %r" % (remote_device,
                                                               device))
    if worker.startswith("rank:"):
        try:
            return int(worker[len("rank:"):]), device
        except ValueError:
            raise ValueError(error) from None
    return worker, device


def _parameter_rrefs(module_rref, recurse):
    """On the owner: RRefs of the module's parameters."""
    module = module_rref.local_value()
    if not isinstance(module, nn.Module):
        raise ValueError(
            "Expect `module_cls(*args, **kwargs)` returns an instance of "
            "<class nn.Module>, but it returns an instance of %s."
            % type(module))
    return [rpc.RRef(p) for p in module.parameters(recurse)]


def _remote_module_from_reference(on, device, module_rref):
    """A RemoteModule that arrived from another worker: the same module on
    the same owner, through a fork of its module RRef."""
    if not isinstance(module_rref, rpc.RRef):
        raise TypeError("a RemoteModule travels with its module's RRef, got "
                        "%r" % (type(module_rref),))
    if not isinstance(on, (str, int)) or not isinstance(device, str):
        raise TypeError("a RemoteModule travels with its owner and device")
    module = RemoteModule.__new__(RemoteModule)
    nn.Module.__init__(module)
    module.on, module.device = on, device
    module.is_scriptable = False
    module.module_rref = module_rref
    return module


def _not_supported(name):
    def method(self, *args, **kwargs):
        raise ValueError("Method ``%s`` not supported for RemoteModule"
                         % (name,))
    method.__name__ = name
    return method


class RemoteModule(nn.Module):
    """An ``nn.Module`` of class ``module_cls`` built with ``*args,
    **kwargs`` on the worker ``remote_device`` names. ``forward`` runs
    there (gradients flow back under distributed autograd);
    ``forward_async`` returns a future of it."""

    def __init__(self, remote_device, module_cls, args=None, kwargs=None,
                 _module_interface_cls=None):
        super().__init__()
        if _module_interface_cls is not None:
            raise NotImplementedError(
                "RemoteModule on tether does not take TorchScript module "
                "interfaces (_module_interface_cls)")
        self.on, self.device = _parse_remote_device(remote_device)
        self.is_scriptable = False
        # The owner builds the module as the result of a remote call.
        self.module_rref = rpc.remote(self.on, module_cls,
                                      args=tuple(args or ()),
                                      kwargs=dict(kwargs or {}))

    def forward(self, *args, **kwargs):
        return self.module_rref.rpc_sync().forward(*args, **kwargs)

    def forward_async(self, *args, **kwargs):
        return self.module_rref.rpc_async().forward(*args, **kwargs)

    def remote_parameters(self, recurse=True):
        """RRefs of the remote module's parameters (and its submodules'
        unless ``recurse`` is False), for the DistributedOptimizer."""
        return rpc.rpc_sync(self.on, _parameter_rrefs,
                            args=(self.module_rref, bool(recurse)))

    def __reduce__(self):
        # Sent to another worker as a reference, as the peer's: its owner,
        # its device and a fork of its module RRef.
        return (_remote_module_from_reference,
                (self.on, self.device, self.module_rref))

    def get_module_rref(self):
        """The RRef of the remote module."""
        return self.module_rref

    def extra_repr(self):
        return "on=%r, device=%r" % (self.on, self.device)

    # What the peer refuses too: the module's state lives on its owner.
    for _name in ("register_buffer", "register_parameter", "add_module",
                  "apply", "cuda", "ipu", "xpu", "cpu", "type", "float",
                  "double", "half", "bfloat16", "to",
                  "register_backward_hook", "register_forward_pre_hook",
                  "register_forward_hook", "state_dict", "load_state_dict",
                  "parameters", "named_parameters", "buffers",
                  "named_buffers", "children", "named_children", "modules",
                  "named_modules", "train", "eval", "requires_grad_",
                  "zero_grad", "share_memory"):
        locals()[_name] = _not_supported(_name)
    del _name
