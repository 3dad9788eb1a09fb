"""The model parts and RPC helpers of rnn/main.py, a module of their own
as in the peer's tutorial "Getting Started with Distributed RPC Framework"
(its RNN part): the parameter server imports this module to build the
embedding table and the decoder that main.py asks it for.
"""
import torch
import torch.nn as nn
import tether.rpc as rpc
from tether.rpc import RRef


def _call_method(method, rref, *args, **kwargs):
    r"""
    a helper function to call a method on the given RRef
    """
    return method(rref.local_value(), *args, **kwargs)


def _remote_method(method, rref, *args, **kwargs):
    r"""
    a helper function to run method on the owner of rref and fetch back the
    result using RPC
    """
    args = [method, rref] + list(args)
    return rpc.rpc_sync(rref.owner(), _call_method, args=args, kwargs=kwargs)


def _parameter_rrefs(module):
    r"""
    Create one RRef for each parameter in the given local module, and return a
    list of RRefs.
    """
    param_rrefs = []
    for param in module.parameters():
        param_rrefs.append(RRef(param))
    return param_rrefs


class EmbeddingTable(nn.Module):
    r"""
    Encoding layers of the RNNModel
    """
    def __init__(self, ntoken, ninp, dropout):
        super(EmbeddingTable, self).__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        # The parameter server may build the embedding table and the decoder
        # at once, on two threads: each draws its weights from a generator of
        # its own, so that they do not depend on which one goes first.
        generator = torch.Generator().manual_seed(1)
        self.encoder.weight.data.uniform_(-0.1, 0.1, generator=generator)

    def forward(self, input):
        return self.drop(self.encoder(input))


class Decoder(nn.Module):
    r"""
    Decoding layers of the RNNModel
    """
    def __init__(self, ntoken, nhid, dropout):
        super(Decoder, self).__init__()
        self.drop = nn.Dropout(dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        # a generator of its own, as EmbeddingTable's
        generator = torch.Generator().manual_seed(2)
        self.decoder.weight.data.uniform_(-0.1, 0.1, generator=generator)
        self.decoder.bias.data.zero_()

    def forward(self, output):
        return self.decoder(self.drop(output))
