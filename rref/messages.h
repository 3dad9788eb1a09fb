// The RRef protocol's message types (core/message.h leaves their values to
// the layers above core). Payloads are tuples; see rref_impl.h. Values are
// part of the wire format: never renumber.
#ifndef TETHER_RREF_MESSAGES_H_
#define TETHER_RREF_MESSAGES_H_

#include "core/message.h"

namespace tether::rref {

inline constexpr MessageType kRemoteCall{6};        // run a function, keep its result as an OwnerRRef
inline constexpr MessageType kRRefFetch{7};         // a user asks the owner for the value
inline constexpr MessageType kRRefUserDelete{8};    // a user tells the owner it is gone
inline constexpr MessageType kRRefForkRequest{9};   // a new user asks the owner to register it
inline constexpr MessageType kRRefChildAccept{10};  // the owner confirmed a child: its parent may let go
inline constexpr MessageType kRRefMethodCall{12};   // run a method of the object an RRef holds
// Their control messages are answered with core's ACK.

// Names them for logs, errors and the faulty backend's settings wherever
// this header is part of the program.
inline const bool kMessageTypesNamed = register_message_type_names({
    {kRemoteCall, "REMOTE_CALL"},
    {kRRefFetch, "RREF_FETCH"},
    {kRRefUserDelete, "RREF_USER_DELETE"},
    {kRRefForkRequest, "RREF_FORK_REQUEST"},
    {kRRefChildAccept, "RREF_CHILD_ACCEPT"},
    {kRRefMethodCall, "RREF_METHOD_CALL"},
});

}  // namespace tether::rref

#endif  // TETHER_RREF_MESSAGES_H_
