// The state of a torch::nn::Module as PyTorch's state_dict() has it: every
// parameter and buffer by its dotted name ("fc.weight"). A RemoteModule's
// owner answers with it when a checkpoint saves the module
// (tether/checkpoint.h: the module's RRef has state_dict() and
// load_state_dict(state) methods), and a checkpoint saves a local module
// the same way, so a module's state reads the same wherever it lives.
//
// Thread safety: as the module's own; loading writes its tensors in place.
#ifndef TETHER_RREF_MODULE_STATE_H_
#define TETHER_RREF_MODULE_STATE_H_

#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>
#include <absl/status/status.h>
#include <torch/nn/module.h>

#include <string>

namespace tether {

// The module's parameters and buffers by name (the tensors themselves,
// detached: a pickle of them copies their values).
c10::Dict<std::string, at::Tensor> module_state_dict(
    const torch::nn::Module& module);

// Copies `state` into the module's parameters and buffers. Strict, as
// PyTorch's load_state_dict is by default: INVALID_ARGUMENT naming the
// first tensor the module has and `state` lacks, one `state` has and the
// module lacks, or one whose shape differs; nothing is copied then.
[[nodiscard]] absl::Status load_module_state_dict(
    torch::nn::Module& module, const c10::Dict<std::string, at::Tensor>& state);

}  // namespace tether

#endif  // TETHER_RREF_MODULE_STATE_H_
