"""A program written for Paddle's paddle.distributed.rpc, on tether.

    python3 paddle_style.py RANK MASTER_PORT

Paddle's init_rpc(name, rank, world_size, master_endpoint="ip:port"),
get_current_worker_info, get_all_worker_infos and WorkerInfo.rank.
"""
import sys

import torch
import tether.rpc as rpc

rank, port = int(sys.argv[1]), int(sys.argv[2])
rpc.init_rpc("worker%d" % rank, rank=rank, world_size=2,
             master_endpoint="127.0.0.1:%d" % port)
me = rpc.get_current_worker_info()
print("me %s rank %d" % (me.name, me.rank))
print("all %s" % [(w.name, w.rank) for w in rpc.get_all_worker_infos()])
if rank == 0:
    print("sum %s" % rpc.rpc_sync("worker1", torch.add,
                                  args=(torch.ones(2), 2)).tolist())
rpc.shutdown()
