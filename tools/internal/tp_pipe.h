// TensorPipe's pipe alone between two processes (no tether agent, codec or
// operator on the path): the floor the tensorpipe backend stands on for a
// small call. tools/rpc_latency.cc runs it beside tether's own call and raw
// TCP, in the same run.
//
// Rank 0 connects a pipe to rank 1 and sends a message whose `metadata` is
// `bytes` bytes, with no payload or tensor: what tether's small call is on
// that backend (an inline frame, backends/tensorpipe/internal/framing.h).
// Rank 1 reads its descriptor, reads it (an empty allocation) and writes
// the same bytes back. Each side issues its next write from its read
// callback, on whichever thread TensorPipe runs it, as tether's agent
// answers; rank 0 times each round trip from its write to its read's
// callback.
#ifndef TETHER_TOOLS_INTERNAL_TP_PIPE_H_
#define TETHER_TOOLS_INTERNAL_TP_PIPE_H_

#include <absl/status/statusor.h>

#include <cstddef>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

namespace tether::bench {

// `name` is the transport: "tcp" (tether's guarded transport, the backend's default)
// or "uv" (TensorPipe's own); the channel is basic. Both ranks call it with
// the same store; rank 0 gets `calls` round-trip samples in us (after a
// tenth as many, at least 100, untimed), rank 1 none.
[[nodiscard]] absl::StatusOr<std::vector<double>> tensorpipe_pipe_ping_pong(
    const std::string& name, int rank, c10d::Store& store, int calls,
    size_t bytes);

}  // namespace tether::bench

#endif  // TETHER_TOOLS_INTERNAL_TP_PIPE_H_
