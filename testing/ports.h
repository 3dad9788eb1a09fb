// pick_unused_port(): a TCP port on loopback that nothing listens on now.
//
// For rendezvous stores in tests: the kernel hands out an ephemeral port, so
// tests running in parallel do not collide (a port reused between the pick
// and the bind is possible but rare; the store then fails with a clear
// error rather than hanging).
#ifndef TETHER_TESTING_PORTS_H_
#define TETHER_TESTING_PORTS_H_

namespace tether::testing {

// Returns the port, or -1 if no socket could be bound.
int pick_unused_port();

}  // namespace tether::testing

#endif  // TETHER_TESTING_PORTS_H_
