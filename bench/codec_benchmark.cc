// Google Benchmark suite of the wire codec (core/wire): encode and decode of
// the messages tether sends most, per call.
//
//   bazel run -c opt //bench:codec_benchmark
#include <ATen/ATen.h>
#include <benchmark/benchmark.h>

#include "core/message.h"
#include "core/wire/codec.h"

namespace tether {
namespace {

// A small call as a Worker sends it without keyword arguments: (name,
// (tensor of 2 floats, scalar), None).
c10::IValue small_call() {
  return c10::ivalue::Tuple::create(
      {c10::IValue(std::string("aten::add.Scalar")),
       c10::ivalue::Tuple::create({c10::IValue(at::ones({2})), 1.0}),
       c10::IValue()});
}

// The same with a keyword argument: (name, (tensor,), {"other": scalar}).
c10::IValue small_call_with_kwargs() {
  c10::impl::GenericDict kwargs(c10::StringType::get(), c10::AnyType::get());
  kwargs.insert(std::string("other"), 1.0);
  return c10::ivalue::Tuple::create(
      {c10::IValue(std::string("aten::add.Scalar")),
       c10::ivalue::Tuple::create({c10::IValue(at::ones({2}))}),
       c10::IValue(kwargs)});
}

c10::IValue tensor_of_bytes(int64_t bytes) {
  return c10::IValue(at::ones({bytes / 4}, at::kFloat));
}

c10::IValue nested_list(int64_t n) {
  c10::impl::GenericList outer(c10::TensorType::get());
  for (int64_t i = 0; i < n; ++i) outer.push_back(at::ones({4}));
  return c10::IValue(outer);
}

void encode_bench(benchmark::State& state, const c10::IValue& value) {
  for (auto _ : state) {
    Message message;
    absl::Status s = wire::encode(value, message);
    if (!s.ok()) state.SkipWithError(s.ToString().c_str());
    benchmark::DoNotOptimize(message.payload.data());
  }
}

void decode_bench(benchmark::State& state, const c10::IValue& value) {
  Message message;
  absl::Status s = wire::encode(value, message);
  if (!s.ok()) state.SkipWithError(s.ToString().c_str());
  for (auto _ : state) {
    absl::StatusOr<c10::IValue> decoded = wire::decode(message);
    if (!decoded.ok()) state.SkipWithError(decoded.status().ToString().c_str());
    benchmark::DoNotOptimize(decoded);
  }
}

void BM_EncodeSmallCall(benchmark::State& state) {
  encode_bench(state, small_call());
}
void BM_DecodeSmallCall(benchmark::State& state) {
  decode_bench(state, small_call());
}
void BM_EncodeSmallCallWithKwargs(benchmark::State& state) {
  encode_bench(state, small_call_with_kwargs());
}
void BM_DecodeSmallCallWithKwargs(benchmark::State& state) {
  decode_bench(state, small_call_with_kwargs());
}
void BM_EncodeTensor(benchmark::State& state) {
  encode_bench(state, tensor_of_bytes(state.range(0)));
}
void BM_DecodeTensor(benchmark::State& state) {
  decode_bench(state, tensor_of_bytes(state.range(0)));
}
void BM_EncodeTensorList(benchmark::State& state) {
  encode_bench(state, nested_list(state.range(0)));
}
void BM_DecodeTensorList(benchmark::State& state) {
  decode_bench(state, nested_list(state.range(0)));
}

BENCHMARK(BM_EncodeSmallCall);
BENCHMARK(BM_DecodeSmallCall);
BENCHMARK(BM_EncodeSmallCallWithKwargs);
BENCHMARK(BM_DecodeSmallCallWithKwargs);
// Storages travel out of band: encode and decode cost stays flat in size.
BENCHMARK(BM_EncodeTensor)->Arg(8)->Arg(1 << 20)->Arg(64 << 20);
BENCHMARK(BM_DecodeTensor)->Arg(8)->Arg(1 << 20)->Arg(64 << 20);
BENCHMARK(BM_EncodeTensorList)->Arg(16)->Arg(1024);
BENCHMARK(BM_DecodeTensorList)->Arg(16)->Arg(1024);

}  // namespace
}  // namespace tether
