"""tether.nn.api: as torch.distributed.nn.api."""
