"""A module no worker allows; only its @rpc.expose function is callable."""
import tether.rpc as rpc


@rpc.expose
def exposed_double(x):
    return 2 * x


def not_exposed(x):
    return x
