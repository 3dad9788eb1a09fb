"""Distributed reinforcement learning, as the peer's tutorial "Getting
Started with Distributed RPC Framework" (its first part) writes it: an
agent holds the policy; observers, each with its own environment, ask the
agent for an action at every step, sending it the observation (a numpy
array) and reporting the reward; the agent trains the policy with
REINFORCE. A small numpy environment stands in for the tutorial's
CartPole: a point on a line chases a target and is rewarded for every
step that brings it closer.

Run (mp.spawn starts the agent and the observers):
    python3 rl_observers.py
MASTER_ADDR and MASTER_PORT come from the environment when set. The only
lines that differ from the torch.distributed.rpc program are the imports
(python/tests/examples_test.py runs it both ways).
"""
import argparse
import os

import numpy as np
import torch
import tether.rpc as rpc
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from tether.rpc import RRef, rpc_async, rpc_sync, remote
from torch.distributions import Categorical

AGENT_NAME = "agent"
OBSERVER_NAME = "obs{}"

parser = argparse.ArgumentParser(description="RPC Reinforcement Learning")
parser.add_argument('--world_size', default=3, type=int, metavar='W',
                    help='number of workers')
parser.add_argument('--episodes', default=60, type=int, metavar='E',
                    help='number of episodes')
parser.add_argument('--steps', default=20, type=int, metavar='S',
                    help='steps of each observer in an episode')
parser.add_argument('--log_interval', type=int, default=10, metavar='N',
                    help='interval between training status logs')
parser.add_argument('--gamma', type=float, default=0.5, metavar='G',
                    help='how much to value future rewards')
parser.add_argument('--seed', type=int, default=1, metavar='S',
                    help='random seed for reproducibility')
args = parser.parse_args()


class ChaseEnv:
    r"""
    A point on the line [-1, 1] chases a target. Action 0 moves it left, 1
    right; the reward is 1 for a step that brings it closer to the target,
    else 0. A caught target jumps somewhere else.
    """
    def __init__(self, seed):
        self.rng = np.random.RandomState(seed)

    def _observation(self):
        return np.array([self.position, self.target], dtype=np.float32)

    def reset(self):
        self.position = 0.0
        self.target = self.rng.uniform(-1, 1)
        return self._observation()

    def step(self, action):
        before = abs(self.target - self.position)
        move = 0.1 if action == 1 else -0.1
        self.position = float(np.clip(self.position + move, -1, 1))
        after = abs(self.target - self.position)
        reward = 1.0 if after < before else 0.0
        if after < 0.1:
            self.target = self.rng.uniform(-1, 1)
        return self._observation(), reward, False, {}


class Policy(nn.Module):
    def __init__(self):
        super(Policy, self).__init__()
        self.affine1 = nn.Linear(2, 32)
        self.affine2 = nn.Linear(32, 2)

    def forward(self, x):
        x = F.relu(self.affine1(x))
        action_scores = self.affine2(x)
        return F.softmax(action_scores, dim=1)


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
    return rpc_sync(rref.owner(), _call_method, args=args, kwargs=kwargs)


class Observer:
    def __init__(self):
        self.id = rpc.get_worker_info().id
        self.env = ChaseEnv(args.seed + self.id)

    def run_episode(self, agent_rref, n_steps):
        r"""
        Run one episode of n_steps.
        Arguments:
            agent_rref (RRef): an RRef referencing the agent object.
            n_steps (int): number of steps in this episode
        """
        state = self.env.reset()
        for step in range(n_steps):
            # send the state to the agent to get an action
            action = rpc_sync(agent_rref.owner(), _call_method,
                              args=(Agent.select_action, agent_rref, self.id,
                                    state))

            # apply the action to the environment, and get the reward
            state, reward, done, _ = self.env.step(action)

            # report the reward to the agent for training purpose
            _remote_method(Agent.report_reward, agent_rref, self.id, reward)

            if done:
                break


class Agent:
    def __init__(self, world_size):
        self.ob_rrefs = []
        self.agent_rref = RRef(self)
        self.rewards = {}
        self.saved_log_probs = {}
        self.policy = Policy()
        self.optimizer = optim.Adam(self.policy.parameters(), lr=1e-2)
        self.eps = np.finfo(np.float32).eps.item()
        self.running_reward = 0
        for ob_rank in range(1, world_size):
            ob_info = rpc.get_worker_info(OBSERVER_NAME.format(ob_rank))
            self.ob_rrefs.append(remote(ob_info, Observer))
            self.rewards[ob_info.id] = []
            self.saved_log_probs[ob_info.id] = []

    def select_action(self, ob_id, state):
        r"""
        This function is mostly borrowed from the Reinforcement Learning
        example (pytorch/examples, reinforcement_learning/reinforce.py).
        The main difference is that instead of keeping all probs in one list,
        the agent keeps probs in a dictionary, one key per observer.

        NB: no need to enforce thread-safety here as GIL will serialize
        executions.
        """
        state = torch.from_numpy(state).float().unsqueeze(0)
        probs = self.policy(state)
        m = Categorical(probs)
        action = m.sample()
        self.saved_log_probs[ob_id].append(m.log_prob(action))
        return action.item()

    def report_reward(self, ob_id, reward):
        r"""
        Observers call this function to report rewards.
        """
        self.rewards[ob_id].append(reward)

    def run_episode(self, n_steps=0):
        r"""
        Run one episode. The agent will tell each observer to run n_steps.
        """
        futs = []
        for ob_rref in self.ob_rrefs:
            # make async RPC to kick off an episode on all observers
            futs.append(
                rpc_async(
                    ob_rref.owner(),
                    _call_method,
                    args=(Observer.run_episode, ob_rref, self.agent_rref,
                          n_steps)
                )
            )

        # wait until all observers have finished this episode
        for fut in futs:
            fut.wait()

    def finish_episode(self):
        r"""
        This function is mostly borrowed from the Reinforcement Learning
        example (pytorch/examples, reinforcement_learning/reinforce.py).
        The main difference is that it joins all probs and rewards from
        different observers into one list, and uses the minimum observer
        rewards as the reward of the current episode.
        """

        # joins probs and rewards from different observers into lists
        R, probs, rewards = 0, [], []
        for ob_id in self.rewards:
            probs.extend(self.saved_log_probs[ob_id])
            rewards.extend(self.rewards[ob_id])

        # use the minimum observer reward to calculate the running reward
        min_reward = min([sum(self.rewards[ob_id])
                          for ob_id in self.rewards])
        self.running_reward = 0.05 * min_reward + \
            (1 - 0.05) * self.running_reward

        # clear saved probs and rewards
        for ob_id in self.rewards:
            self.rewards[ob_id] = []
            self.saved_log_probs[ob_id] = []

        policy_loss, returns = [], []
        for r in rewards[::-1]:
            R = r + args.gamma * R
            returns.insert(0, R)
        returns = torch.tensor(returns)
        returns = (returns - returns.mean()) / (returns.std() + self.eps)
        for log_prob, R in zip(probs, returns):
            policy_loss.append(-log_prob * R)
        self.optimizer.zero_grad()
        policy_loss = torch.cat(policy_loss).sum()
        policy_loss.backward()
        self.optimizer.step()
        return min_reward


def run_worker(rank, world_size):
    r"""
    This is the entry point for all processes. The rank 0 is the agent. All
    other ranks are observers.
    """
    os.environ.setdefault('MASTER_ADDR', 'localhost')
    os.environ.setdefault('MASTER_PORT', '29500')
    torch.manual_seed(args.seed)
    if rank == 0:
        # rank0 is the agent
        rpc.init_rpc(AGENT_NAME, rank=rank, world_size=world_size)

        agent = Agent(world_size)
        rewards = []
        for i_episode in range(1, args.episodes + 1):
            agent.run_episode(n_steps=args.steps)
            last_reward = agent.finish_episode()
            rewards.append(last_reward / args.steps)

            if i_episode % args.log_interval == 0:
                print('Episode {}\tLast reward: {:.2f}\tAverage reward: {:.2f}'
                      .format(i_episode, last_reward, agent.running_reward))
        print('reward first {:.3f} last {:.3f}'.format(
            sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10))
    else:
        # other ranks are the observer
        rpc.init_rpc(OBSERVER_NAME.format(rank), rank=rank,
                     world_size=world_size)
        # observers passively waiting for instructions from the agent

    # block until all rpcs finish, and shutdown the RPC instance
    rpc.shutdown()


if __name__ == '__main__':
    mp.spawn(
        run_worker,
        args=(args.world_size, ),
        nprocs=args.world_size,
        join=True
    )
