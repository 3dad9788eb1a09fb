// pick_unused_port(): a TCP port on loopback that nothing is bound to now.
//
// For rendezvous stores in tests, which must name their port before the
// process that serves it binds it. The port is chosen below the kernel's
// ephemeral range (/proc/sys/net/ipv4/ip_local_port_range), at random:
// servers that bind port 0 and outgoing connections take their ports from
// that range, so none of them can take the picked port between the pick and
// the bind. Only another test picking the same port in the same instant
// can, and the candidates are thousands.
#ifndef TETHER_TESTING_PORTS_H_
#define TETHER_TESTING_PORTS_H_

namespace tether::testing {

// Returns the port, or -1 if no socket could be bound.
int pick_unused_port();

}  // namespace tether::testing

#endif  // TETHER_TESTING_PORTS_H_
