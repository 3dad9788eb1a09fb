// Distributed autograd's message types (core/message.h leaves their values
// to the layers above core). Payloads are tuples; see backward.h and
// the engine. Values are part of the wire format: never renumber.
#ifndef TETHER_AUTOGRAD_MESSAGES_H_
#define TETHER_AUTOGRAD_MESSAGES_H_

#include "core/message.h"

namespace tether::autograd {

// Gradients for a send node: run a pass from it.
inline constexpr MessageType kAutogradBackward{13};
// A context was left: forget it, tell its peers.
inline constexpr MessageType kAutogradCleanup{14};
// The response to kAutogradBackward when its pass has gradients for the
// requester's own recv nodes: they ride back in it instead of a BACKWARD of
// their own. Otherwise that response is core's ACK.
inline constexpr MessageType kAutogradBackwardRet{17};

// Names them for logs, errors and the faulty backend's settings wherever
// this header is part of the program.
inline const bool kMessageTypesNamed = register_message_type_names({
    {kAutogradBackward, "AUTOGRAD_BACKWARD"},
    {kAutogradCleanup, "AUTOGRAD_CLEANUP"},
    {kAutogradBackwardRet, "AUTOGRAD_BACKWARD_RET"},
});

}  // namespace tether::autograd

#endif  // TETHER_AUTOGRAD_MESSAGES_H_
