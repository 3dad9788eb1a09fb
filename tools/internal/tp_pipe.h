// TensorPipe's pipe alone between two processes (no tether agent, codec or
// operator on the path): the floor the tensorpipe backend stands on for a
// small call. tools/rpc_latency.cc runs it beside tether's own call and raw
// TCP, in the same run.
//
// Rank 0 connects a pipe to rank 1 and sends a message laid out as the
// backend lays out a call carrying `data_bytes` of tensor data
// (backends/tensorpipe/internal/framing.h): up to the inline limit, all in
// `metadata` (kFrameBytes of header and encoded call, then the data), with
// no payload or tensor; above it, kFrameBytes of metadata and the data as
// one payload, read from the pipe's connection into a buffer of the
// receiver's. With `data_bytes` 0 it is a small call. Rank 1 reads its
// descriptor, reads it and writes the same layout back. Each side issues
// its next write from its read callback, on whichever thread TensorPipe
// runs it, as tether's agent answers; rank 0 times each round trip from
// its write to its read's callback.
#ifndef TETHER_TOOLS_INTERNAL_TP_PIPE_H_
#define TETHER_TOOLS_INTERNAL_TP_PIPE_H_

#include <absl/status/statusor.h>

#include <cstddef>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

namespace tether::bench {

// About what tether's inline frame of a small rpc_sync is: its header and
// the encoded call.
inline constexpr size_t kFrameBytes = 128;

// `name` is the transport: "tcp" (tether's guarded transport, the backend's default)
// or "uv" (TensorPipe's own); the channel is basic. Both ranks call it with
// the same store; rank 0 gets `calls` round-trip samples in us (after a
// tenth as many, at least 100, untimed), rank 1 none.
[[nodiscard]] absl::StatusOr<std::vector<double>> tensorpipe_pipe_ping_pong(
    const std::string& name, int rank, c10d::Store& store, int calls,
    size_t data_bytes = 0);

}  // namespace tether::bench

#endif  // TETHER_TOOLS_INTERNAL_TP_PIPE_H_
