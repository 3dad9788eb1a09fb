"""RNN model parallelism, as the peer's tutorial "Getting Started with
Distributed RPC Framework" (its second part) writes it: the embedding
table and the decoder live on a parameter server, the LSTM on the trainer,
which trains the whole model with distributed autograd and a
DistributedOptimizer. The model parts and the RPC helpers are in the
module rnn.py beside this file. The task: predict the next token of
sequences that step by 3 modulo the vocabulary.

Run (mp.spawn starts both ranks):
    python3 main.py
MASTER_ADDR and MASTER_PORT come from the environment when set. The only
lines that differ from the torch.distributed.rpc program (and its rnn.py)
are the imports (python/tests/examples_test.py runs it both ways).
"""
import os

import torch
import tether.autograd as dist_autograd
import tether.rpc as rpc
import torch.multiprocessing as mp
import torch.nn as nn
import torch.optim as optim
from tether.optim import DistributedOptimizer

import rnn


class RNNModel(nn.Module):
    r"""
    A distributed RNN model which puts embedding table and decoder parameters
    on a remote parameter server, and locally holds parameters for the LSTM
    module. The structure of the RNN model is borrowed from the word language
    model example of pytorch/examples (word_language_model/model.py).
    """
    def __init__(self, ps, ntoken, ninp, nhid, nlayers, dropout=0.2):
        super(RNNModel, self).__init__()

        # setup embedding table remotely
        self.emb_table_rref = rpc.remote(ps, rnn.EmbeddingTable,
                                         args=(ntoken, ninp, dropout))
        # setup LSTM locally
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
        # setup decoder remotely
        self.decoder_rref = rpc.remote(ps, rnn.Decoder,
                                       args=(ntoken, nhid, dropout))

    def forward(self, input, hidden):
        # pass input to the remote embedding table and fetch emb tensor back
        emb = rnn._remote_method(rnn.EmbeddingTable.forward,
                                 self.emb_table_rref, input)
        output, hidden = self.rnn(emb, hidden)
        # pass output to the remote decoder and get the decoded output back
        decoded = rnn._remote_method(rnn.Decoder.forward, self.decoder_rref,
                                     output)
        return decoded, hidden

    def parameter_rrefs(self):
        remote_params = []
        # get RRefs of embedding table
        remote_params.extend(rpc.rpc_sync(
            self.emb_table_rref.owner(), rnn._call_method,
            args=(rnn._parameter_rrefs, self.emb_table_rref)))
        # create RRefs for local parameters
        remote_params.extend(rnn._parameter_rrefs(self.rnn))
        # get RRefs of decoder
        remote_params.extend(rpc.rpc_sync(
            self.decoder_rref.owner(), rnn._call_method,
            args=(rnn._parameter_rrefs, self.decoder_rref)))
        return remote_params


def _run_trainer():
    r"""
    The trainer creates a distributed RNNModel and a DistributedOptimizer.
    Then, it performs training on sequences that step by 3.
    """
    seq_len = 6
    batch = 4
    ntoken = 10
    ninp = 8
    nhid = 16
    nlayers = 2
    hidden = (
        torch.zeros(nlayers, batch, nhid),
        torch.zeros(nlayers, batch, nhid)
    )

    model = RNNModel('ps', ntoken, ninp, nhid, nlayers)

    # setup distributed optimizer
    opt = DistributedOptimizer(
        optim.Adam,
        model.parameter_rrefs(),
        lr=0.05,
    )

    criterion = torch.nn.CrossEntropyLoss()

    def get_next_batch():
        for _ in range(5):
            start = torch.randint(0, ntoken, (1, batch))
            steps = 3 * torch.arange(seq_len + 1).view(-1, 1)
            tokens = (start + steps) % ntoken
            yield tokens[:-1], tokens[1:]

    losses = []
    # train for 12 epochs
    for epoch in range(12):
        epoch_loss = 0.0
        for data, target in get_next_batch():
            # create distributed autograd context
            with dist_autograd.context() as context_id:
                hidden[0].detach_()
                hidden[1].detach_()
                output, hidden = model(data, hidden)
                loss = criterion(output.view(-1, ntoken), target.view(-1))
                # run distributed backward pass
                dist_autograd.backward(context_id, [loss])
                # run distributed optimizer
                opt.step(context_id)
                # not necessary to zero grads as each iteration creates a
                # different distributed autograd context which hosts
                # different grads
            epoch_loss += loss.item()
        losses.append(epoch_loss / 5)
        print("Training epoch {} loss {:.6f}".format(epoch, losses[-1]))
    print("first loss {:.6f} final loss {:.6f}".format(losses[0],
                                                       losses[-1]))


def run_worker(rank, world_size):
    r"""
    A wrapper function that initializes RPC, calls the function, and shuts
    down RPC.
    """
    os.environ.setdefault('MASTER_ADDR', 'localhost')
    os.environ.setdefault('MASTER_PORT', '29500')
    torch.manual_seed(rank)
    if rank == 1:
        rpc.init_rpc("trainer", rank=rank, world_size=world_size)
        _run_trainer()
    else:
        rpc.init_rpc("ps", rank=rank, world_size=world_size)
        # parameter server does nothing
        pass

    # block until all rpcs finish
    rpc.shutdown()


if __name__ == "__main__":
    world_size = 2
    mp.spawn(run_worker, args=(world_size, ), nprocs=world_size, join=True)
