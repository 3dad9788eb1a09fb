// DistributedOptimizer: steps LibTorch optimizers over parameters that live
// on several workers, with the gradients of a distributed autograd context
// (docs/architecture.md section 7).
//
// The parameters are RRefs to leaf tensors on any workers (RRef::local on
// their owner). create() groups them by owner and builds, on each owner, one
// torch::optim optimizer of the chosen kind over that owner's tensors (an
// object the owner keeps alive through an RRef). step(context_id) asks every
// owner at once to step with the gradients the context accumulated there:
// they are set as the parameters' .grad for the step only (the .grad a user
// set is put back), so gradients live in the context as in distributed
// autograd, and a parameter without one is skipped as LibTorch skips it.
// Steps on one owner run one at a time, whichever optimizer asks.
//
//   optim::Options options;
//   options.lr = 0.05;
//   options.momentum = 0.9;
//   TETHER_ASSIGN_OR_RETURN(
//       optim::DistributedOptimizer opt,
//       optim::DistributedOptimizer::create(optim::Kind::kSGD, params,
//                                           options));
//   ... within a context: forward, autograd::backward(context.id(), {loss})
//   TETHER_RETURN_IF_ERROR(opt.step(context.id()));
//
// Ownership: a DistributedOptimizer holds an RRef to each owner's optimizer;
// destroy it before shutdown (graceful shutdown also releases it).
// Thread safety: step/save/load may be called from any thread.
#ifndef TETHER_OPTIM_OPTIMIZER_H_
#define TETHER_OPTIM_OPTIMIZER_H_

#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include <optional>
#include <string>
#include <vector>

#include "core/worker.h"
#include "rref/rref.h"

namespace tether::optim {

// The torch::optim optimizer each owner runs.
enum class Kind { kSGD, kAdam, kAdamW, kAdagrad, kRMSprop };

// "SGD", "Adam", ...
const char* kind_name(Kind kind);

// Hyper-parameters; an unset one takes LibTorch's default for the kind
// (SGD has none for lr: it must be set). Setting one the kind does not have
// is INVALID_ARGUMENT.
struct Options {
  std::optional<double> lr;
  std::optional<double> weight_decay;  // all kinds
  std::optional<double> momentum;      // SGD, RMSprop
  std::optional<double> dampening;     // SGD
  std::optional<bool> nesterov;        // SGD
  std::optional<double> beta1;         // Adam, AdamW
  std::optional<double> beta2;         // Adam, AdamW
  std::optional<double> eps;           // Adam, AdamW, Adagrad, RMSprop
  std::optional<bool> amsgrad;         // Adam, AdamW
  std::optional<double> lr_decay;      // Adagrad
  std::optional<double> initial_accumulator_value;  // Adagrad
  std::optional<double> alpha;         // RMSprop
  std::optional<bool> centered;        // RMSprop
};

class DistributedOptimizer {
 public:
  // Builds the optimizers on the owners of `params` (every one an RRef to a
  // tensor), from `worker` (or current_worker()), and waits until each
  // owner has built its own. Errors: INVALID_ARGUMENT for no parameters or
  // bad options; a failure on an owner (a value that is not a tensor, a
  // value LibTorch refuses) names that worker.
  [[nodiscard]] static absl::StatusOr<DistributedOptimizer> create(
      Worker& worker, Kind kind, const std::vector<RRef>& params,
      const Options& options = Options());
  [[nodiscard]] static absl::StatusOr<DistributedOptimizer> create(
      Kind kind, const std::vector<RRef>& params,
      const Options& options = Options());

  // Every owner steps with the gradients `context_id` holds there, at once;
  // returns when all are done, with the first error (naming its worker).
  [[nodiscard]] absl::Status step(int64_t context_id);

  // Each owner's optimizer state (LibTorch's serialization), one blob per
  // owner in owners() order; load() puts such blobs back, e.g. into an
  // optimizer created over the same parameters in a new run.
  [[nodiscard]] absl::StatusOr<std::vector<std::string>> save() const;
  [[nodiscard]] absl::Status load(const std::vector<std::string>& states);

  const std::vector<WorkerInfo>& owners() const { return owners_; }

  // The optimizer each owner runs (the custom class tether.LocalOptimizer),
  // in owners() order. Its methods state_dict() (save()'s blob as a uint8
  // tensor) and load_state_dict(state) act on that owner alone, so a
  // checkpoint has each owner write its own (tether/checkpoint.h).
  const std::vector<RRef>& local_optimizers() const { return optimizers_; }

 private:
  DistributedOptimizer(std::vector<WorkerInfo> owners,
                       std::vector<RRef> optimizers)
      : owners_(std::move(owners)), optimizers_(std::move(optimizers)) {}

  std::vector<WorkerInfo> owners_;
  // The optimizer object on each owner, same order.
  std::vector<RRef> optimizers_;
};

}  // namespace tether::optim

#endif  // TETHER_OPTIM_OPTIMIZER_H_
