#include "optim/optimizer.h"

#include <absl/container/flat_hash_map.h>
#include <absl/strings/str_cat.h>
#include <absl/synchronization/mutex.h>
#include <torch/custom_class.h>
#include <torch/library.h>
#include <torch/optim.h>
#include <torch/serialize.h>

#include <cstring>
#include <memory>
#include <sstream>
#include <utility>

#include "autograd/autograd.h"
#include "core/rpc.h"

namespace tether::optim {
namespace {

// The class each owner builds, by its qualified name.
constexpr char kLocalOptimizer[] =
    "__torch__.torch.classes.tether.LocalOptimizer";

// Hyper-parameters as they travel: name -> value (booleans as 0 or 1).
using WireOptions = c10::Dict<std::string, double>;

// The options each kind takes.
const std::vector<std::string>& accepted(Kind kind) {
  static const auto* table = new absl::flat_hash_map<Kind, std::vector<std::string>>{
      {Kind::kSGD, {"lr", "weight_decay", "momentum", "dampening", "nesterov"}},
      {Kind::kAdam, {"lr", "weight_decay", "beta1", "beta2", "eps", "amsgrad"}},
      {Kind::kAdamW, {"lr", "weight_decay", "beta1", "beta2", "eps", "amsgrad"}},
      {Kind::kAdagrad,
       {"lr", "weight_decay", "eps", "lr_decay", "initial_accumulator_value"}},
      {Kind::kRMSprop,
       {"lr", "weight_decay", "eps", "momentum", "alpha", "centered"}},
  };
  return table->at(kind);
}

absl::StatusOr<Kind> kind_of(const std::string& name) {
  for (Kind kind : {Kind::kSGD, Kind::kAdam, Kind::kAdamW, Kind::kAdagrad,
                    Kind::kRMSprop}) {
    if (name == kind_name(kind)) return kind;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown optimizer kind '", name, "'"));
}

absl::StatusOr<WireOptions> to_wire(Kind kind, const Options& options) {
  WireOptions out;
  auto put = [&](const char* name, auto value) {
    if (value.has_value()) out.insert(name, static_cast<double>(*value));
  };
  put("lr", options.lr);
  put("weight_decay", options.weight_decay);
  put("momentum", options.momentum);
  put("dampening", options.dampening);
  put("nesterov", options.nesterov);
  put("beta1", options.beta1);
  put("beta2", options.beta2);
  put("eps", options.eps);
  put("amsgrad", options.amsgrad);
  put("lr_decay", options.lr_decay);
  put("initial_accumulator_value", options.initial_accumulator_value);
  put("alpha", options.alpha);
  put("centered", options.centered);
  const std::vector<std::string>& ok = accepted(kind);
  for (const auto& entry : out) {
    if (std::find(ok.begin(), ok.end(), entry.key()) == ok.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("option '", entry.key(), "' does not apply to ",
                       kind_name(kind)));
    }
  }
  if (kind == Kind::kSGD && !options.lr.has_value()) {
    return absl::InvalidArgumentError("SGD needs a learning rate (lr)");
  }
  return out;
}

// Builds the torch::optim optimizer of `kind` over `params` (LibTorch checks
// the values and throws on a bad one).
std::unique_ptr<torch::optim::Optimizer> make_optimizer(
    Kind kind, const WireOptions& o, std::vector<at::Tensor> params) {
  auto has = [&](const char* name) { return o.contains(name); };
  auto get = [&](const char* name) { return o.at(name); };
  switch (kind) {
    case Kind::kSGD: {
      torch::optim::SGDOptions options(get("lr"));
      if (has("weight_decay")) options.weight_decay(get("weight_decay"));
      if (has("momentum")) options.momentum(get("momentum"));
      if (has("dampening")) options.dampening(get("dampening"));
      if (has("nesterov")) options.nesterov(get("nesterov") != 0);
      return std::make_unique<torch::optim::SGD>(std::move(params), options);
    }
    case Kind::kAdam:
    case Kind::kAdamW: {
      auto fill = [&](auto options) {
        if (has("lr")) options.lr(get("lr"));
        if (has("weight_decay")) options.weight_decay(get("weight_decay"));
        auto betas = options.betas();
        if (has("beta1")) std::get<0>(betas) = get("beta1");
        if (has("beta2")) std::get<1>(betas) = get("beta2");
        options.betas(betas);
        if (has("eps")) options.eps(get("eps"));
        if (has("amsgrad")) options.amsgrad(get("amsgrad") != 0);
        return options;
      };
      if (kind == Kind::kAdam) {
        return std::make_unique<torch::optim::Adam>(
            std::move(params), fill(torch::optim::AdamOptions()));
      }
      return std::make_unique<torch::optim::AdamW>(
          std::move(params), fill(torch::optim::AdamWOptions()));
    }
    case Kind::kAdagrad: {
      torch::optim::AdagradOptions options;
      if (has("lr")) options.lr(get("lr"));
      if (has("weight_decay")) options.weight_decay(get("weight_decay"));
      if (has("eps")) options.eps(get("eps"));
      if (has("lr_decay")) options.lr_decay(get("lr_decay"));
      if (has("initial_accumulator_value")) {
        options.initial_accumulator_value(get("initial_accumulator_value"));
      }
      return std::make_unique<torch::optim::Adagrad>(std::move(params),
                                                     options);
    }
    case Kind::kRMSprop: {
      torch::optim::RMSpropOptions options;
      if (has("lr")) options.lr(get("lr"));
      if (has("weight_decay")) options.weight_decay(get("weight_decay"));
      if (has("eps")) options.eps(get("eps"));
      if (has("momentum")) options.momentum(get("momentum"));
      if (has("alpha")) options.alpha(get("alpha"));
      if (has("centered")) options.centered(get("centered") != 0);
      return std::make_unique<torch::optim::RMSprop>(std::move(params),
                                                     options);
    }
  }
  TORCH_CHECK(false, "unknown optimizer kind");
}

// Steps on one owner run one at a time, whichever optimizer asks: two
// trainers' optimizers over the same parameters must not interleave.
absl::Mutex& step_mutex() {
  static auto* mu = new absl::Mutex;
  return *mu;
}

// The optimizer an owner runs over its own parameters.
struct LocalOptimizer : torch::CustomClassHolder {
  LocalOptimizer(std::string kind_name, WireOptions options,
                 c10::IValue param_rrefs) {
    absl::StatusOr<Kind> kind = kind_of(kind_name);
    TORCH_CHECK(kind.ok(), kind.status().ToString());
    TORCH_CHECK(param_rrefs.isList(), "parameters must be a list of RRefs");
    for (const c10::IValue& value : param_rrefs.toListRef()) {
      absl::StatusOr<RRef> rref = RRef::from_ivalue(value);
      TORCH_CHECK(rref.ok(), rref.status().ToString());
      absl::StatusOr<c10::IValue> param = rref->local_value();
      TORCH_CHECK(param.ok(), param.status().ToString());
      TORCH_CHECK(param->isTensor(), "parameter ", params.size(),
                  " holds a ", param->tagKind(), ", not a tensor");
      const at::Tensor& t = param->toTensor();
      // One that does not require grad gets no gradient and is skipped, as
      // torch.optim skips it.
      TORCH_CHECK(t.is_leaf(), "parameter ", params.size(),
                  " is not a leaf tensor");
      params.push_back(t);
    }
    optimizer = make_optimizer(*kind, options, params);
  }

  void step(int64_t context_id) {
    Worker* worker = Worker::serving();
    TORCH_CHECK(worker != nullptr, "step must run as an RPC");
    absl::StatusOr<c10::Dict<at::Tensor, at::Tensor>> grads =
        autograd::get_gradients(*worker, context_id);
    TORCH_CHECK(grads.ok(), grads.status().ToString());
    absl::MutexLock lock(&step_mutex());
    std::vector<at::Tensor> saved;
    saved.reserve(params.size());
    for (at::Tensor& p : params) {
      saved.push_back(p.grad());
      auto it = grads->find(p);
      p.mutable_grad() = it == grads->end() ? at::Tensor() : it->value();
    }
    try {
      optimizer->step();
    } catch (...) {
      for (size_t i = 0; i < params.size(); ++i) {
        params[i].mutable_grad() = saved[i];
      }
      throw;
    }
    for (size_t i = 0; i < params.size(); ++i) {
      params[i].mutable_grad() = saved[i];
    }
  }

  int64_t size() { return static_cast<int64_t>(params.size()); }

  std::string save() {
    absl::MutexLock lock(&step_mutex());
    std::ostringstream out;
    torch::serialize::OutputArchive archive;
    optimizer->save(archive);
    archive.save_to(out);
    return out.str();
  }

  void load(const std::string& state) {
    absl::MutexLock lock(&step_mutex());
    std::istringstream in(state);
    torch::serialize::InputArchive archive;
    archive.load_from(in);
    optimizer->load(archive);
  }

  // save() and load() as a checkpoint item (tether/checkpoint.h): the bytes
  // as a uint8 tensor, which pickles and crosses to Python as it is (a
  // string of them need not be UTF-8).
  at::Tensor state_dict() {
    const std::string state = save();
    at::Tensor out = at::empty({static_cast<int64_t>(state.size())}, at::kByte);
    std::memcpy(out.data_ptr(), state.data(), state.size());
    return out;
  }

  void load_state_dict(const at::Tensor& state) {
    TORCH_CHECK(state.scalar_type() == at::kByte && state.dim() == 1,
                "an optimizer's state is a 1-dimensional uint8 tensor, got ",
                state.scalar_type(), " of ", state.dim(), " dimensions");
    const at::Tensor bytes = state.contiguous();
    load(std::string(static_cast<const char*>(bytes.data_ptr()),
                     static_cast<size_t>(bytes.numel())));
  }

  std::vector<at::Tensor> params;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
};

// Waits for every future; the first error, else OK.
template <typename T>
absl::Status wait_all(std::vector<Future<T>>& futures) {
  absl::Status first = absl::OkStatus();
  for (Future<T>& f : futures) {
    absl::StatusOr<T> r = f.get();
    if (!r.ok() && first.ok()) first = r.status();
  }
  return first;
}

absl::StatusOr<Worker*> default_worker() {
  Worker* worker = current_worker();
  if (worker == nullptr) {
    return absl::FailedPreconditionError(
        "no RPC worker: call tether::init_rpc() first");
  }
  return worker;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(tether, m) {
  m.class_<LocalOptimizer>("LocalOptimizer")
      .def(torch::init<std::string, WireOptions, c10::IValue>())
      .def("step", &LocalOptimizer::step)
      .def("size", &LocalOptimizer::size)
      .def("save", &LocalOptimizer::save)
      .def("load", &LocalOptimizer::load)
      .def("state_dict", &LocalOptimizer::state_dict)
      .def("load_state_dict", &LocalOptimizer::load_state_dict);
}

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::kSGD:
      return "SGD";
    case Kind::kAdam:
      return "Adam";
    case Kind::kAdamW:
      return "AdamW";
    case Kind::kAdagrad:
      return "Adagrad";
    case Kind::kRMSprop:
      return "RMSprop";
  }
  return "?";
}

absl::StatusOr<DistributedOptimizer> DistributedOptimizer::create(
    Worker& worker, Kind kind, const std::vector<RRef>& params,
    const Options& options) {
  if (params.empty()) {
    return absl::InvalidArgumentError(
        "DistributedOptimizer needs at least one parameter");
  }
  absl::StatusOr<WireOptions> wire = to_wire(kind, options);
  if (!wire.ok()) return wire.status();
  // Owners in the order their first parameter comes.
  std::vector<WorkerInfo> owners;
  std::vector<c10::impl::GenericList> lists;
  for (const RRef& param : params) {
    if (!param.valid()) {
      return absl::InvalidArgumentError("a parameter RRef is empty");
    }
    const WorkerInfo owner = param.owner();
    size_t i = 0;
    while (i < owners.size() && !(owners[i] == owner)) ++i;
    if (i == owners.size()) {
      owners.push_back(owner);
      lists.emplace_back(c10::AnyType::get());
    }
    lists[i].push_back(param.to_ivalue());
  }
  std::vector<RRef> optimizers;
  for (size_t i = 0; i < owners.size(); ++i) {
    absl::StatusOr<RRef> made =
        remote(worker, owners[i], kLocalOptimizer,
               {c10::IValue(std::string(kind_name(kind))), c10::IValue(*wire),
                c10::IValue(lists[i])});
    if (!made.ok()) return made.status();
    optimizers.push_back(*std::move(made));
  }
  // Waits until every owner built its optimizer (or says why not).
  std::vector<Future<c10::IValue>> built;
  for (const RRef& optimizer : optimizers) {
    built.push_back(optimizer.rpc_async().call("size", {}));
  }
  if (absl::Status ok = wait_all(built); !ok.ok()) {
    return absl::Status(ok.code(),
                        absl::StrCat("DistributedOptimizer(", kind_name(kind),
                                     "): ", ok.message()));
  }
  return DistributedOptimizer(std::move(owners), std::move(optimizers));
}

absl::StatusOr<DistributedOptimizer> DistributedOptimizer::create(
    Kind kind, const std::vector<RRef>& params, const Options& options) {
  absl::StatusOr<Worker*> worker = default_worker();
  if (!worker.ok()) return worker.status();
  return create(**worker, kind, params, options);
}

absl::Status DistributedOptimizer::step(int64_t context_id) {
  std::vector<Future<c10::IValue>> steps;
  for (const RRef& optimizer : optimizers_) {
    steps.push_back(optimizer.rpc_async().call("step", {context_id}));
  }
  return wait_all(steps);
}

absl::StatusOr<std::vector<std::string>> DistributedOptimizer::save() const {
  std::vector<Future<c10::IValue>> saved;
  for (const RRef& optimizer : optimizers_) {
    saved.push_back(optimizer.rpc_async().call("save", {}));
  }
  if (absl::Status ok = wait_all(saved); !ok.ok()) return ok;
  std::vector<std::string> states;
  for (Future<c10::IValue>& f : saved) {
    states.push_back(f.result()->toStringRef());
  }
  return states;
}

absl::Status DistributedOptimizer::load(
    const std::vector<std::string>& states) {
  if (states.size() != optimizers_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(states.size(), " optimizer states for ",
                     optimizers_.size(), " owners"));
  }
  std::vector<Future<c10::IValue>> loaded;
  for (size_t i = 0; i < optimizers_.size(); ++i) {
    loaded.push_back(optimizers_[i].rpc_async().call("load", {states[i]}));
  }
  return wait_all(loaded);
}

}  // namespace tether::optim
