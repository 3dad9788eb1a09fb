"""A parameter server, as the peer's tutorial "Implementing a Parameter
Server Using Distributed RPC Framework" writes it: the parameter server
holds the model; each trainer drives it through an RRef, runs the backward
pass with distributed autograd and steps a DistributedOptimizer over RRefs
of the server's parameters. A small classifier on a synthetic data set
stands in for the tutorial's MNIST network.

Run one process per rank (rank 0 is the parameter server):
    python3 parameter_server.py --rank 0 &
    python3 parameter_server.py --rank 1 &
    python3 parameter_server.py --rank 2
MASTER_ADDR and MASTER_PORT come from the environment when set. The only
lines that differ from the torch.distributed.rpc program are the imports
(python/tests/examples_test.py runs it both ways).
"""
import argparse
import os
from threading import Lock

import torch
import tether.autograd as dist_autograd
import tether.rpc as rpc
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch import optim
from tether.optim import DistributedOptimizer
from torch.utils.data import DataLoader, TensorDataset

NUM_FEATURES = 20
NUM_CLASSES = 4
EPOCHS = 3


# --------- Network to train --------------------

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = nn.Linear(NUM_FEATURES, 32)
        self.dropout = nn.Dropout(0.1)
        self.fc2 = nn.Linear(32, NUM_CLASSES)

    def forward(self, x):
        x = F.relu(self.fc1(x))
        x = self.dropout(x)
        return F.log_softmax(self.fc2(x), dim=1)


# --------- Helper Methods --------------------

# On the local node, call a method with first arg as the value held by the
# RRef. Other args are passed in as arguments to the function called.
# Useful for calling instance methods.
def call_method(method, rref, *args, **kwargs):
    return method(rref.local_value(), *args, **kwargs)


# Given an RRef, return the result of calling the passed in method on the
# value held by the RRef. This call is done on the remote node that owns the
# RRef. args and kwargs are passed into the method.
def remote_method(method, rref, *args, **kwargs):
    args = [method, rref] + list(args)
    return rpc.rpc_sync(rref.owner(), call_method, args=args, kwargs=kwargs)


# --------- Parameter Server --------------------

class ParameterServer(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = Net()

    def forward(self, inp):
        # Other trainers step the parameters in place while this trainer's
        # backward pass still needs them: autograd keeps copies of what it
        # saves for the backward pass, not the parameters themselves.
        with torch.autograd.graph.saved_tensors_hooks(torch.clone,
                                                      lambda t: t):
            return self.model(inp)

    # Use dist autograd to retrieve gradients accumulated for this model.
    # Primarily used for verification.
    def get_dist_gradients(self, cid):
        grads = dist_autograd.get_gradients(cid)
        return {k: v for k, v in grads.items()}

    # Wrap local parameters in a RRef. Needed for building the
    # DistributedOptimizer which optimizes parameters remotely.
    def get_param_rrefs(self):
        return [rpc.RRef(param) for param in self.model.parameters()]


param_server = None
global_lock = Lock()


def get_parameter_server():
    global param_server
    # Ensure that we get only one handle to the ParameterServer.
    with global_lock:
        if not param_server:
            # construct it once
            param_server = ParameterServer()
        return param_server


def run_parameter_server(rank, world_size):
    # The parameter server just acts as a host for the model and responds to
    # requests from trainers. rpc.shutdown() waits for all workers to
    # complete, which here means until every trainer is done.
    print("PS master initializing RPC")
    rpc.init_rpc(name="parameter_server", rank=rank, world_size=world_size)
    print("RPC initialized! Running parameter server...")
    rpc.shutdown()
    print("RPC shutdown on parameter server.")


# --------- Trainers --------------------

# nn.Module corresponding to the network trained by this trainer. The
# forward() method simply invokes the network on the given parameter server.
class TrainerNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.param_server_rref = rpc.remote(
            "parameter_server", get_parameter_server)

    def get_global_param_rrefs(self):
        return remote_method(ParameterServer.get_param_rrefs,
                             self.param_server_rref)

    def forward(self, x):
        return remote_method(ParameterServer.forward, self.param_server_rref,
                             x)


def run_training_loop(rank, train_loader, test_loader):
    # Runs the typical neural network forward + backward + optimizer step,
    # but in a distributed fashion.
    net = TrainerNet()
    # Build DistributedOptimizer.
    param_rrefs = net.get_global_param_rrefs()
    opt = DistributedOptimizer(optim.SGD, param_rrefs, lr=0.3)
    epoch_losses = []
    for epoch in range(EPOCHS):
        losses = []
        for i, (data, target) in enumerate(train_loader):
            with dist_autograd.context() as cid:
                model_output = net(data)
                loss = F.nll_loss(model_output, target)
                if i % 5 == 0:
                    print(f"Rank {rank} training batch {i} loss {loss.item()}")
                dist_autograd.backward(cid, [loss])
                # Ensure that dist autograd ran successfully and gradients
                # were returned.
                assert remote_method(ParameterServer.get_dist_gradients,
                                     net.param_server_rref, cid) != {}
                opt.step(cid)
            losses.append(loss.item())
        epoch_losses.append(sum(losses) / len(losses))
        print(f"Rank {rank} epoch {epoch} mean loss {epoch_losses[-1]:.4f}")

    print("Training complete!")
    print("Getting accuracy....")
    accuracy = get_accuracy(test_loader, net)
    print(f"Rank {rank} first loss {epoch_losses[0]:.4f} "
          f"final loss {epoch_losses[-1]:.4f} accuracy {accuracy:.3f}")


def get_accuracy(test_loader, model):
    model.eval()
    correct_sum = 0
    total = 0
    with torch.no_grad():
        for data, target in test_loader:
            out = model(data)
            pred = out.argmax(dim=1, keepdim=True)
            correct_sum += pred.eq(target.view_as(pred)).sum().item()
            total += len(target)
    return correct_sum / total


# Main loop for trainers.
def run_worker(rank, world_size, train_loader, test_loader):
    print(f"Worker rank {rank} initializing RPC")
    rpc.init_rpc(name=f"trainer_{rank}", rank=rank, world_size=world_size)
    print(f"Worker {rank} done initializing RPC")
    run_training_loop(rank, train_loader, test_loader)
    rpc.shutdown()


# --------- Data --------------------

def synthetic_dataset(num_samples, seed):
    """Points labelled by a fixed random linear teacher."""
    teacher = torch.Generator().manual_seed(1234)
    w = torch.randn(NUM_FEATURES, NUM_CLASSES, generator=teacher)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_samples, NUM_FEATURES, generator=g)
    return TensorDataset(x, (x @ w).argmax(dim=1))


# --------- Launcher --------------------

if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description="Parameter-Server RPC based training")
    parser.add_argument(
        "--world_size",
        type=int,
        default=3,
        help="""Total number of participating processes. Should be the sum of
        master node and all training nodes.""")
    parser.add_argument(
        "--rank",
        type=int,
        default=None,
        help="Global rank of this process. Pass in 0 for master.")
    parser.add_argument(
        "--master_addr",
        type=str,
        default=os.environ.get("MASTER_ADDR", "localhost"),
        help="""Address of master, will default to localhost if not provided.
        Master must be able to accept network traffic on the address +
        port.""")
    parser.add_argument(
        "--master_port",
        type=str,
        default=os.environ.get("MASTER_PORT", "29500"),
        help="""Port that master is listening on, will default to 29500 if not
        provided. Master must be able to accept network traffic on the host and
        port.""")

    args = parser.parse_args()
    assert args.rank is not None, "must provide rank argument."
    os.environ["MASTER_ADDR"] = args.master_addr
    os.environ["MASTER_PORT"] = args.master_port
    processes = []
    world_size = args.world_size
    if args.rank == 0:
        p = mp.Process(target=run_parameter_server, args=(0, world_size))
        p.start()
        processes.append(p)
    else:
        # Get data to train on
        torch.manual_seed(args.rank)
        train_loader = DataLoader(synthetic_dataset(640, seed=args.rank),
                                  batch_size=32, shuffle=True)
        test_loader = DataLoader(synthetic_dataset(256, seed=100),
                                 batch_size=64, shuffle=False)
        # start training worker on this node
        p = mp.Process(
            target=run_worker,
            args=(args.rank, world_size, train_loader, test_loader))
        p.start()
        processes.append(p)

    for p in processes:
        p.join()
