#include "rref/module_state.h"

#include <ATen/ATen.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>

#include <vector>

namespace tether {
namespace {

// The module's tensors by name: parameters, then buffers.
std::vector<std::pair<std::string, at::Tensor>> named_tensors(
    const torch::nn::Module& module) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : module.named_parameters()) {
    out.emplace_back(item.key(), item.value());
  }
  for (const auto& item : module.named_buffers()) {
    out.emplace_back(item.key(), item.value());
  }
  return out;
}

std::string shape(const at::Tensor& t) {
  return absl::StrCat("[", absl::StrJoin(t.sizes(), ", "), "]");
}

}  // namespace

c10::Dict<std::string, at::Tensor> module_state_dict(
    const torch::nn::Module& module) {
  c10::Dict<std::string, at::Tensor> out;
  for (auto& [name, tensor] : named_tensors(module)) {
    out.insert(name, tensor.detach());
  }
  return out;
}

absl::Status load_module_state_dict(
    torch::nn::Module& module,
    const c10::Dict<std::string, at::Tensor>& state) {
  const std::vector<std::pair<std::string, at::Tensor>> mine =
      named_tensors(module);
  for (const auto& [name, tensor] : mine) {
    auto it = state.find(name);
    if (it == state.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the state has no '", name, "' for the module's ", shape(tensor)));
    }
    if (!it->value().sizes().equals(tensor.sizes())) {
      return absl::InvalidArgumentError(
          absl::StrCat("the state's '", name, "' is ", shape(it->value()),
                       ", the module's ", shape(tensor)));
    }
  }
  if (state.size() != mine.size()) {
    for (const auto& entry : state) {
      bool known = false;
      for (const auto& item : mine) known = known || item.first == entry.key();
      if (!known) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the state has '", entry.key(), "', which the module has not"));
      }
    }
  }
  at::NoGradGuard no_grad;
  for (const auto& [name, tensor] : mine) tensor.copy_(state.at(name));
  return absl::OkStatus();
}

}  // namespace tether
