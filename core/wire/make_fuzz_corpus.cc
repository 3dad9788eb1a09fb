// Writes seed inputs for codec_fuzz into the folder named by argv[1], in the
// fuzzer's input format (see codec_fuzz.cc): a layout byte, then a payload
// that encode produced for a few representative values.
#include <ATen/core/ivalue.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/sparse_coo_tensor.h>
#include <ATen/ops/zeros.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "core/message.h"
#include "core/wire/capsules.h"
#include "core/wire/codec.h"
#include "core/wire/profiled.h"

namespace {

constexpr int64_t kStorageBytes[4] = {0, 16, 64, 1024};

// The layout byte whose storages are each at least as large as `message`'s,
// or -1 if they do not fit.
int layout_for(const tether::Message& message) {
  if (message.storages.size() > 3) return -1;
  int layout = static_cast<int>(message.storages.size());
  for (size_t i = 0; i < message.storages.size(); ++i) {
    int code = 0;
    while (code < 4 && kStorageBytes[code] <
                           static_cast<int64_t>(message.storages[i].nbytes())) {
      ++code;
    }
    if (code == 4) return -1;
    layout |= code << (2 + 2 * i);
  }
  return layout;
}

// Writes `message` as the seed `name` in `dir`: the layout byte, then
// the payload. False if the write failed.
bool write_seed(const std::string& dir, const std::string& name, int layout,
                const tether::Message& message) {
  std::ofstream out(dir + "/" + name, std::ios::binary | std::ios::trunc);
  out.put(static_cast<char>(layout));
  out << message.payload;
  return static_cast<bool>(out);
}

c10::IValue tuple_of(std::vector<c10::IValue> elems) {
  return c10::ivalue::Tuple::create(std::move(elems));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUTPUT_DIR\n", argv[0]);
    return 2;
  }
  at::Tensor floats = at::arange(6, at::kFloat).reshape({2, 3});
  c10::Dict<std::string, at::Tensor> state;
  state.insert("w", floats.t());
  state.insert("b", at::zeros({3}, at::kDouble));
  c10::List<c10::optional<at::Tensor>> maybe;
  maybe.push_back(c10::nullopt);
  maybe.push_back(at::arange(4, at::kLong));
  c10::Dict<int64_t, c10::List<double>> by_int;
  by_int.insert(3, c10::List<double>({1.5, 2.5}));

  // Sparse COO: a coalesced 3x2 and an uncoalesced hybrid (1 dense dim).
  at::Tensor indices = at::arange(4, at::kLong).remainder(2).reshape({2, 2});
  at::Tensor coalesced =
      at::sparse_coo_tensor(indices, at::arange(2, at::kFloat), {3, 2})
          .coalesce();
  at::Tensor hybrid = at::sparse_coo_tensor(
      at::zeros({1, 2}, at::kLong), floats.narrow(0, 0, 2).narrow(1, 0, 2),
      {4, 2});

  const std::vector<std::pair<std::string, c10::IValue>> seeds = {
      {"none", c10::IValue()},
      {"scalars", tuple_of({true, int64_t{-7}, 2.5, c10::complex<double>(1, -1),
                            c10::IValue("str"), c10::Device(c10::kCPU)})},
      {"tensor", floats},
      {"transposed_and_expanded",
       tuple_of({floats.t(), at::arange(3, at::kInt).expand({4, 3})})},
      {"enums",
       tuple_of({tether::wire::TorchEnum::make(
                     tether::wire::TorchEnum::Kind::kDtype,
                     static_cast<int64_t>(at::kFloat)),
                 tether::wire::TorchEnum::make(
                     tether::wire::TorchEnum::Kind::kLayout,
                     static_cast<int64_t>(c10::kSparse)),
                 tether::wire::TorchEnum::make(
                     tether::wire::TorchEnum::Kind::kMemoryFormat,
                     static_cast<int64_t>(c10::MemoryFormat::ChannelsLast))})},
      {"sparse", coalesced},
      {"sparse_hybrid", hybrid},
      {"undefined_and_empty", tuple_of({at::Tensor(), at::zeros({0, 2})})},
      {"call", tuple_of({c10::IValue("aten::add"),
                         tuple_of({floats, floats, int64_t{1}}),
                         c10::impl::GenericDict(c10::StringType::get(),
                                                c10::AnyType::get())})},
      {"containers",
       tuple_of({c10::List<int64_t>({1, 2, 3}), c10::List<bool>({true, false}),
                 state, maybe, by_int})},
  };
  // The wrappers of profiled calls (profiled.h): a CALL under the profiler,
  // and its response with two events.
  tether::wire::ProfiledEvent push;
  push.kind = 1;
  push.name = "aten::add";
  push.thread_id = 3;
  push.handle = 17;
  push.shapes = {{2, 3}, {}};
  push.node_id = 1;
  push.cpu_ns = 1000;
  tether::wire::ProfiledEvent pop = push;
  pop.kind = 2;
  pop.shapes.clear();
  pop.cpu_ns = 2500;
  tether::wire::ProfilerSettings settings;
  settings.record_shapes = true;
  auto seed = [&seeds](const std::string& name) {
    for (const auto& [n, value] : seeds) {
      if (n == name) return value;
    }
    return c10::IValue();
  };
  const std::vector<std::pair<std::string, c10::IValue>> wrapped = {
      {"profiled_request", seed("call")},
      {"profiled_response", seed("tensor")},
  };
  for (const auto& [name, value] : wrapped) {
    tether::Message inner;
    absl::Status status = tether::wire::encode(value, inner);
    absl::StatusOr<tether::Message> message =
        !status.ok() ? absl::StatusOr<tether::Message>(status)
        : name == "profiled_request"
            ? tether::wire::wrap_profiled_request(inner, settings)
            : tether::wire::wrap_profiled_response(inner, {push, pop});
    const int layout = message.ok() ? layout_for(*message) : -1;
    if (layout < 0 || !write_seed(argv[1], name, layout, *message)) {
      std::fprintf(stderr, "seed %s: not written\n", name.c_str());
      return 1;
    }
  }
  for (const auto& [name, value] : seeds) {
    tether::Message message;
    absl::Status status = tether::wire::encode(value, message);
    const int layout = status.ok() ? layout_for(message) : -1;
    if (layout < 0) {
      std::fprintf(
          stderr, "seed %s: %s\n", name.c_str(),
          status.ok() ? "storages too large" : status.ToString().c_str());
      return 1;
    }
    if (!write_seed(argv[1], name, layout, message)) {
      std::fprintf(stderr, "seed %s: write failed\n", name.c_str());
      return 1;
    }
  }
  return 0;
}
