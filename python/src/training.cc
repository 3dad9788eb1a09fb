#include "python/src/training.h"

#include <ATen/core/Tensor.h>
#include <pybind11/stl.h>
#include <torch/csrc/autograd/python_cpp_function.h>
#include <torch/csrc/autograd/python_variable.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "autograd/autograd.h"
#include "core/rpc.h"
#include "optim/optimizer.h"
#include "python/src/status.h"
#include "rref/rref.h"

namespace tether::python {
namespace {

namespace py = pybind11;

// A distributed autograd context entered by `with tether.autograd.context()`
// and released by its exit (or, failing that, when collected).
class ContextHandle {
 public:
  explicit ContextHandle(autograd::Context context)
      : id_(context.id()), context_(std::move(context)) {}
  ~ContextHandle() {
    if (context_.has_value()) {
      py::gil_scoped_release nogil;
      context_.reset();
    }
  }

  int64_t id() const { return id_; }

  // Leaves the context on this thread and releases it on every worker that
  // took part; a second call does nothing.
  void release() {
    std::optional<autograd::Context> context = std::move(context_);
    context_.reset();
    py::gil_scoped_release nogil;
    context.reset();
  }

 private:
  int64_t id_;
  std::optional<autograd::Context> context_;
};

std::vector<at::Tensor> tensors_of(const py::sequence& roots,
                                   const std::string& what) {
  std::vector<at::Tensor> out;
  out.reserve(roots.size());
  for (size_t i = 0; i < roots.size(); ++i) {
    py::object item = roots[i];
    if (!THPVariable_Check(item.ptr())) {
      throw py::type_error(what + "[" + std::to_string(i) +
                           "] is not a tensor but a " +
                           std::string(py::str(
                               py::type::handle_of(item).attr("__qualname__"))));
    }
    out.push_back(THPVariable_Unpack(item.ptr()));
  }
  return out;
}

py::dict gradients(int64_t context_id) {
  absl::StatusOr<c10::Dict<at::Tensor, at::Tensor>> grads =
      autograd::get_gradients(context_id);
  py::dict out;
  // Tensors keep their Python objects (LibTorch preserves them), so the
  // keys are the caller's own parameters.
  for (const auto& entry : value_or_throw(std::move(grads))) {
    out[py::reinterpret_steal<py::object>(THPVariable_Wrap(entry.key()))] =
        py::reinterpret_steal<py::object>(THPVariable_Wrap(entry.value()));
  }
  return out;
}

optim::Kind kind_named(const std::string& name) {
  for (optim::Kind kind :
       {optim::Kind::kSGD, optim::Kind::kAdam, optim::Kind::kAdamW,
        optim::Kind::kAdagrad, optim::Kind::kRMSprop}) {
    if (name == optim::kind_name(kind)) return kind;
  }
  throw py::value_error("unknown optimizer kind '" + name +
                        "': tether steps SGD, Adam, AdamW, Adagrad, RMSprop");
}

// Python keyword -> Options field; tether.optim maps the torch.optim
// class's arguments to these names (betas -> beta1, beta2).
optim::Options options_of(const py::dict& given) {
  optim::Options options;
  for (auto item : given) {
    const std::string key = py::str(item.first);
    py::handle value = item.second;
    auto real = [&] { return value.cast<double>(); };
    auto flag = [&] { return value.cast<bool>(); };
    if (key == "lr") {
      options.lr = real();
    } else if (key == "weight_decay") {
      options.weight_decay = real();
    } else if (key == "momentum") {
      options.momentum = real();
    } else if (key == "dampening") {
      options.dampening = real();
    } else if (key == "nesterov") {
      options.nesterov = flag();
    } else if (key == "beta1") {
      options.beta1 = real();
    } else if (key == "beta2") {
      options.beta2 = real();
    } else if (key == "eps") {
      options.eps = real();
    } else if (key == "amsgrad") {
      options.amsgrad = flag();
    } else if (key == "lr_decay") {
      options.lr_decay = real();
    } else if (key == "initial_accumulator_value") {
      options.initial_accumulator_value = real();
    } else if (key == "alpha") {
      options.alpha = real();
    } else if (key == "centered") {
      options.centered = flag();
    } else {
      throw py::value_error("unknown optimizer option '" + key + "'");
    }
  }
  return options;
}

}  // namespace

void bind_training(py::module_& m) {
  py::class_<ContextHandle>(m, "AutogradContext")
      .def_property_readonly("id", &ContextHandle::id)
      .def("release", &ContextHandle::release);

  m.def("autograd_enter", [] {
    return std::make_unique<ContextHandle>(
        value_or_throw(autograd::Context::enter()));
  });
  m.def("autograd_current_context",
        [] { return value_or_throw(autograd::current_context_id()); });
  m.def(
      "autograd_backward",
      [](int64_t context_id, const py::sequence& roots, bool retain_graph) {
        std::vector<at::Tensor> tensors = tensors_of(roots, "roots");
        absl::Status done;
        {
          py::gil_scoped_release nogil;
          done = autograd::backward(context_id, tensors, retain_graph);
        }
        // The passes ran on this thread, Python autograd Functions
        // included (their GIL taken by LibTorch): one that raised can leave
        // its exception set in this thread's state although LibTorch
        // caught it and `done` carries its text. Left set, the next call
        // into Python here fails with SystemError.
        if (PyErr_Occurred() != nullptr) PyErr_Clear();
        check(done);
      },
      py::arg("context_id"), py::arg("roots"), py::arg("retain_graph"));
  m.def("autograd_get_gradients", &gradients, py::arg("context_id"));
  // The peer's dist_autograd._get_debug_info(): its keys, values as text.
  m.def("autograd_debug_info", [] {
    Worker& me = worker_or_throw();
    absl::StatusOr<autograd::AutogradDebugInfo> info;
    {
      py::gil_scoped_release nogil;
      info = autograd::autograd_debug_info(me);
    }
    const autograd::AutogradDebugInfo counts = value_or_throw(std::move(info));
    py::dict out;
    out["num_current_backward_passes"] =
        std::to_string(counts.backward_passes);
    out["num_autograd_contexts"] = std::to_string(counts.contexts);
    return out;
  });
  // The peer's _send_functions() / _recv_functions() of a context: two
  // dicts {autograd message id: node}, the nodes as LibTorch's Python
  // autograd functions (name(), next_functions).
  m.def(
      "autograd_context_nodes",
      [](int64_t context_id) {
        Worker& me = worker_or_throw();
        absl::StatusOr<autograd::ContextNodes> nodes;
        {
          py::gil_scoped_release nogil;
          nodes = autograd::context_nodes(me, context_id);
        }
        const autograd::ContextNodes found = value_or_throw(std::move(nodes));
        auto to_dict = [](const auto& by_message) {
          py::dict out;
          for (const auto& [message, node] : by_message) {
            out[py::int_(message)] = py::reinterpret_steal<py::object>(
                torch::autograd::functionToPyObject(node));
          }
          return out;
        };
        return py::make_tuple(to_dict(found.sends), to_dict(found.recvs));
      },
      py::arg("context_id"));
  m.def("autograd_max_context_id",
        [] { return autograd::max_context_id(worker_or_throw()); });
  m.def(
      "autograd_context_peers",
      [](int64_t context_id) {
        return value_or_throw(autograd::context_peers(context_id));
      },
      py::arg("context_id"));

  py::class_<optim::DistributedOptimizer>(m, "DistributedOptimizer")
      .def(py::init([](const std::string& kind, const std::vector<RRef>& params,
                       const py::dict& options) {
             optim::Kind k = kind_named(kind);
             optim::Options o = options_of(options);
             absl::StatusOr<optim::DistributedOptimizer> made;
             {
               py::gil_scoped_release nogil;
               made = optim::DistributedOptimizer::create(k, params, o);
             }
             return value_or_throw(std::move(made));
           }),
           py::arg("kind"), py::arg("params"), py::arg("options"))
      .def(
          "step",
          [](optim::DistributedOptimizer& self, int64_t context_id) {
            absl::Status done;
            {
              py::gil_scoped_release nogil;
              done = self.step(context_id);
            }
            check(done);
          },
          py::arg("context_id"))
      .def_property_readonly("owners", &optim::DistributedOptimizer::owners)
      // Each owner's optimizer (its state_dict() and load_state_dict()),
      // for tether.checkpoint.
      .def_property_readonly("local_optimizers",
                             &optim::DistributedOptimizer::local_optimizers);
}

}  // namespace tether::python
