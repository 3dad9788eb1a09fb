// The payloads of PROFILED_REQUEST and PROFILED_RESPONSE.
#include "core/wire/profiled.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/jit_type.h>
#include <ATen/ops/_sparse_coo_tensor_unsafe.h>
#include <ATen/ops/_validate_sparse_coo_tensor_args.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/core/ScalarType.h>
#include <c10/core/Storage.h>
#include <google/protobuf/arena.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/message.h>
#include <google/protobuf/unknown_field_set.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <exception>
#include <new>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "core/wire/internal/codec_support.h"
#include "core/wire/wire.pb.h"

namespace tether::wire {

using codec_internal::has_unknown_fields;
using codec_internal::kWireVersion;
namespace pb = ::tether::wire;

namespace {

// Parses a wrapper's payload into `m` (on `arena`): INVALID_ARGUMENT
// naming `what` if it is no such message, has unknown fields or another
// version; RESOURCE_EXHAUSTED over the payload limit.
template <typename M>
absl::Status parse_wrapper(const std::string& payload, const char* what,
                           const Limits& limits, M& m) {
  const int64_t size = static_cast<int64_t>(payload.size());
  if (size > limits.max_payload_bytes || size > INT_MAX) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, " payload of ", size, " bytes is over the limit of ",
        std::min<int64_t>(limits.max_payload_bytes, INT_MAX)));
  }
  if (!m.ParseFromString(payload)) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed ", what, ": not its wire form"));
  }
  if (has_unknown_fields(m)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "malformed ", what, ": unknown fields (from a newer version?)"));
  }
  if (m.version() != kWireVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed ", what, ": unsupported wire version ",
                     m.version(), " (this build speaks ", kWireVersion, ")"));
  }
  if (m.type() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "malformed ", what, ": it wraps a message of type ", m.type()));
  }
  return absl::OkStatus();
}

// The wrapper's payload serialized, with `inner`'s id and storages.
template <typename M>
absl::StatusOr<Message> wrapped(const M& m, MessageType type, Message inner) {
  if (m.ByteSizeLong() > static_cast<size_t>(INT_MAX)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        message_type_name(type), " of ", m.ByteSizeLong(),
        " bytes is over protobuf's 2 GiB limit"));
  }
  Message out;
  out.type = type;
  out.id = inner.id;
  if (!m.SerializeToString(&out.payload)) {
    return absl::InternalError(
        absl::StrCat("serializing a ", message_type_name(type), " failed"));
  }
  out.storages = std::move(inner.storages);
  return out;
}

// The message a parsed wrapper `m` of `in` wraps: `in`'s id and storages.
template <typename M>
Message inner_message(M& m, Message in) {
  Message out;
  out.type = static_cast<MessageType>(m.type());
  out.id = in.id;
  out.payload = std::move(*m.mutable_payload());
  out.storages = std::move(in.storages);
  return out;
}

}  // namespace

absl::StatusOr<Message> wrap_profiled_request(Message inner,
                                              const ProfilerSettings& settings) {
  pb::ProfiledRequestPayload m;
  m.set_version(kWireVersion);
  m.set_type(static_cast<int32_t>(inner.type));
  m.set_payload(std::move(inner.payload));
  m.set_record_shapes(settings.record_shapes);
  m.set_profile_memory(settings.profile_memory);
  m.set_with_stack(settings.with_stack);
  m.set_with_flops(settings.with_flops);
  m.set_with_modules(settings.with_modules);
  return wrapped(m, MessageType::kProfiledRequest, std::move(inner));
}

absl::StatusOr<Message> unwrap_profiled_request(Message in,
                                                ProfilerSettings& settings,
                                                const Limits& limits) {
  pb::ProfiledRequestPayload m;
  if (absl::Status s = parse_wrapper(in.payload, "PROFILED_REQUEST", limits, m);
      !s.ok()) {
    return s;
  }
  settings.record_shapes = m.record_shapes();
  settings.profile_memory = m.profile_memory();
  settings.with_stack = m.with_stack();
  settings.with_flops = m.with_flops();
  settings.with_modules = m.with_modules();
  return inner_message(m, std::move(in));
}

absl::StatusOr<Message> wrap_profiled_response(
    Message inner, const std::vector<ProfiledEvent>& events) {
  pb::ProfiledResponsePayload m;
  m.set_version(kWireVersion);
  m.set_type(static_cast<int32_t>(inner.type));
  m.set_payload(std::move(inner.payload));
  m.mutable_events()->Reserve(static_cast<int>(events.size()));
  for (const ProfiledEvent& e : events) {
    pb::ProfilerEvent* out = m.add_events();
    out->set_kind(static_cast<uint32_t>(e.kind));
    out->set_name(e.name);
    out->set_thread_id(e.thread_id);
    out->set_handle(e.handle);
    for (const std::vector<int64_t>& shape : e.shapes) {
      out->add_shapes()->mutable_sizes()->Add(shape.begin(), shape.end());
    }
    out->set_node_id(e.node_id);
    out->set_cpu_memory_usage(e.cpu_memory_usage);
    out->set_cpu_ns(e.cpu_ns);
  }
  return wrapped(m, MessageType::kProfiledResponse, std::move(inner));
}

absl::StatusOr<Message> unwrap_profiled_response(
    Message in, std::vector<ProfiledEvent>& events, const Limits& limits) {
  pb::ProfiledResponsePayload m;
  if (absl::Status s =
          parse_wrapper(in.payload, "PROFILED_RESPONSE", limits, m);
      !s.ok()) {
    return s;
  }
  events.clear();
  events.reserve(m.events_size());
  for (int i = 0; i < m.events_size(); ++i) {
    const pb::ProfilerEvent& e = m.events(i);
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat(
          "malformed PROFILED_RESPONSE: event ", i, " ", why));
    };
    if (has_unknown_fields(e)) return bad("has unknown fields");
    if (e.kind() > kMaxProfiledEventKind) {
      return bad(absl::StrCat("has the unknown kind ", e.kind()));
    }
    if (e.cpu_ns() <= 0) {
      return bad(absl::StrCat("has the time ", e.cpu_ns(), " ns"));
    }
    if (e.node_id() < -1) {
      return bad(absl::StrCat("names the worker ", e.node_id()));
    }
    ProfiledEvent out;
    out.kind = static_cast<int>(e.kind());
    out.name = e.name();
    out.thread_id = e.thread_id();
    out.handle = e.handle();
    out.shapes.reserve(e.shapes_size());
    for (const pb::EventShape& shape : e.shapes()) {
      if (has_unknown_fields(shape)) return bad("has a shape of unknown form");
      if (shape.sizes_size() > limits.max_tensor_dims) {
        return bad(absl::StrCat("has a shape of ", shape.sizes_size(),
                                " dimensions, over the limit max_tensor_dims "
                                "of ", limits.max_tensor_dims));
      }
      out.shapes.emplace_back(shape.sizes().begin(), shape.sizes().end());
    }
    out.node_id = e.node_id();
    out.cpu_memory_usage = e.cpu_memory_usage();
    out.cpu_ns = e.cpu_ns();
    events.push_back(std::move(out));
  }
  return inner_message(m, std::move(in));
}

}  // namespace tether::wire
