"""A program written for Paddle's paddle.distributed.rpc, on tether.

    python3 paddle_style.py RANK MASTER_PORT

Paddle's init_rpc(name, rank, world_size, master_endpoint="ip:port"),
get_current_worker_info, get_all_worker_infos, get_worker_info and
WorkerInfo.rank, .ip and .port.
"""
import errno
import socket
import sys

import torch
import tether.rpc as rpc

rank, port = int(sys.argv[1]), int(sys.argv[2])
rpc.init_rpc("worker%d" % rank, rank=rank, world_size=2,
             master_endpoint="127.0.0.1:%d" % port)
me = rpc.get_current_worker_info()
print("me %s rank %d" % (me.name, me.rank))
print("all %s" % [(w.name, w.rank) for w in rpc.get_all_worker_infos()])
print("endpoint %s %s" % (me.ip, me.port))
print("endpoints %s" % [(w.name, w.ip, w.port)
                        for w in rpc.get_all_worker_infos()])
if rank == 0:
    print("sum %s" % rpc.rpc_sync("worker1", torch.add,
                                  args=(torch.ones(2), 2)).tolist())
    peer = rpc.get_worker_info("worker1")
    if peer.port is not None:
        # Something listens there: the port cannot be bound again.
        with socket.socket() as s:
            try:
                s.bind((peer.ip, peer.port))
                print("worker1's port is free")
            except OSError as e:
                print("worker1's port is taken: %s"
                      % (e.errno == errno.EADDRINUSE))
rpc.shutdown()
print("after shutdown %s %s" % (me.ip, me.port))
