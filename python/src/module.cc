// tether._C: the Python extension over tether's C++ API (docs/architecture.md
// section 11). tether/rpc/__init__.py is its user-facing side; this module
// is internal.
//
// Threads and the GIL: every call that waits or moves bytes (init, rpc_sync,
// the send of rpc_async and remote, to_here, shutdown) releases the GIL.
// Python functions called by peers run on the worker pool, holding the GIL
// only while Python runs (PythonCallables, callable_provider.h). The
// futures rpc_async returns are torch.futures.Future objects
// (tether.rpc._future.RpcFuture); they complete on the thread that waits
// for them (PyCompletion) or on threads of futures.cc (Completer), which
// take the GIL to turn the value into Python objects and run the user's
// callbacks: an agent's threads never wait for the GIL.
//
// This file holds the bindings; values are converted in convert.h, futures
// in futures.h, GIL profiling in gil_profiling.h.
#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>
#include <absl/status/statusor.h>
#include <absl/strings/ascii.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/jit/python/python_ivalue.h>
#include <torch/version.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "autograd/autograd.h"
#include "autograd/rref_backward.h"
#include "backends/builtin.h"
#include "core/huge_pages.h"
#include "core/profiling.h"
#include "core/rpc.h"
#include "core/wire/profiled.h"
#include "python/src/callable_provider.h"
#include "python/src/convert.h"
#include "python/src/futures.h"
#include "python/src/gil_profiling.h"
#include "python/src/script.h"
#include "python/src/status.h"
#include "python/src/training.h"
#include "rref/rref.h"
#include "tether/version.h"

namespace tether::python {
namespace {

namespace py = pybind11;

void raise_python(const absl::Status& status) {
  py::object make =
      py::module_::import("tether.rpc._errors").attr("exception_for");
  py::object exc = make(static_cast<int>(status.code()),
                        std::string(status.message()));
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
}

// The peer's rule and texts for worker names (its WorkerInfo), which its
// tests and users' programs match.
constexpr size_t kMaxNameLength = 128;

void check_worker_name(const std::string& name) {
  if (name.empty()) throw std::runtime_error("Worker name must be non-empty");
  if (name.size() >= kMaxNameLength) {
    throw std::runtime_error("Worker name must be shorter than " +
                             std::to_string(kMaxNameLength) +
                             " characters, but got " +
                             std::to_string(name.size()));
  }
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '-' &&
        c != '_') {
      throw std::runtime_error(
          "Worker name must match ^[A-Za-z0-9-_]*$, but got: " + name);
    }
  }
}

absl::Duration to_duration(double seconds) {
  if (seconds < 0) return kDefaultTimeout;
  if (seconds == 0) return absl::ZeroDuration();  // no bound
  return absl::Seconds(seconds);
}

To to_target(py::handle to) {
  if (py::isinstance<WorkerInfo>(to)) return To(to.cast<WorkerInfo>());
  if (PyLong_Check(to.ptr()) && !PyBool_Check(to.ptr())) {
    return To(to.cast<int>());
  }
  if (PyUnicode_Check(to.ptr())) return To(to.cast<std::string>());
  if (PyFloat_Check(to.ptr())) {
    // As the peer: a rank that is a number but not an int is a bad value.
    throw py::value_error("'to' must be a worker name (str), a rank (int) "
                          "or a WorkerInfo, got the float " +
                          std::string(py::str(to)));
  }
  throw py::type_error(
      "'to' must be a worker name (str), a rank (int) or a WorkerInfo, got " +
      std::string(py::str(py::type::handle_of(to).attr("__qualname__"))));
}

class PythonExtension : public WorkerExtension {};

const BackendRegistry& registry() {
  static const BackendRegistry* registry = [] {
    auto* r = new BackendRegistry();
    absl::Status registered = backends::register_builtin_backends(*r);
    if (!registered.ok()) throw RpcError(registered);
    return r;
  }();
  return *registry;
}

void init_rpc(const std::string& name, int rank, int world_size,
              const std::string& backend, const std::string& init_method,
              int num_worker_threads, double rpc_timeout, double init_timeout,
              const std::map<std::string, std::string>& backend_settings,
              const std::string& auth_secret, py::handle serve,
              py::handle failure, double busy_poll, double spare_core_poll) {
  check_worker_name(name);
  RpcOptions options;
  options.backend = backend;
  options.init_method = init_method;
  options.num_worker_threads = num_worker_threads;
  options.default_timeout =
      rpc_timeout <= 0 ? absl::ZeroDuration() : absl::Seconds(rpc_timeout);
  options.init_timeout = absl::Seconds(init_timeout);
  for (const auto& [key, value] : backend_settings) {
    options.backend_settings[key] = value;
  }
  options.auth_secret = auth_secret;
  options.busy_poll = absl::Seconds(busy_poll);
  options.spare_core_poll = absl::Seconds(spare_core_poll);
  auto callables = std::make_shared<PythonCallables>(serve, failure);
  ExtensionFactory python =
      [callables](Worker& worker)
      -> absl::StatusOr<std::unique_ptr<WorkerExtension>> {
    absl::Status added = worker.add_callable_provider("py::", callables);
    if (!added.ok()) return added;
    return std::make_unique<PythonExtension>();
  };
  const BackendRegistry& backends = registry();
  absl::Status up;
  {
    py::gil_scoped_release nogil;
    up = tether::init_rpc(
        name, rank, world_size, options, backends,
        {rref_extension(), autograd::autograd_extension(), python});
  }
  check(up);
  // The events this process's profiler records carry its rank, as the
  // peer's (a remote event carries its callee's: core/profiling.h).
  absl::StatusOr<WorkerInfo> self = get_current_worker_info();
  if (self.ok()) at::RecordFunction::setDefaultNodeId(self->id);
}

// `key`: what the call is named in the caller's profile when it runs
// LibTorch's legacy profiler (core/profiling.h), or None.
using ProfilingKey = std::optional<std::string>;

py::object rpc_sync(py::handle to, const std::string& fn,
                    const py::tuple& args, const py::dict& kwargs,
                    double timeout, const ProfilingKey& key) {
  To target = to_target(to);
  std::vector<c10::IValue> a = to_args(args, fn);
  Kwargs k = to_kwargs(kwargs, fn);
  absl::StatusOr<c10::IValue> result;
  {
    std::optional<profiling::CallKey> named;
    if (key.has_value()) named.emplace(*key);
    py::gil_scoped_release nogil;
    result = tether::rpc_sync(target, fn, std::move(a), std::move(k),
                              to_duration(timeout));
  }
  return to_python(value_or_throw(std::move(result)));
}

py::object rpc_async(py::handle to, const std::string& fn,
                     const py::tuple& args, const py::dict& kwargs,
                     double timeout, const ProfilingKey& key) {
  To target = to_target(to);
  std::vector<c10::IValue> a = to_args(args, fn);
  Kwargs k = to_kwargs(kwargs, fn);
  Future<c10::IValue> future;
  {
    std::optional<profiling::CallKey> named;
    if (key.has_value()) named.emplace(*key);
    py::gil_scoped_release nogil;
    future = tether::rpc_async(target, fn, std::move(a), std::move(k),
                               to_duration(timeout));
  }
  return python_future(std::move(future));
}

RRef remote(py::handle to, const std::string& fn, const py::tuple& args,
            const py::dict& kwargs, double timeout, const ProfilingKey& key) {
  To target = to_target(to);
  std::vector<c10::IValue> a = to_args(args, fn);
  Kwargs k = to_kwargs(kwargs, fn);
  absl::StatusOr<RRef> rref;
  {
    std::optional<profiling::CallKey> named;
    if (key.has_value()) named.emplace(*key);
    py::gil_scoped_release nogil;
    rref = tether::remote(target, fn, std::move(a), std::move(k),
                          to_duration(timeout));
  }
  return value_or_throw(std::move(rref));
}

// The peer's rpc.api._all_gather(obj, worker_names, timeout) over
// Worker::all_gather (core/worker.h): `names` empty is the whole group;
// `timeout` in seconds, negative the worker's RPC timeout (as the peer's
// UNSET_RPC_TIMEOUT), 0 none. Returns {name: value}.
py::dict gather(py::handle value, std::vector<std::string> names,
                    double timeout) {
  c10::IValue v = to_ivalue(value, Objects::kRefuse, "the value to gather");
  Worker& me = worker_or_throw();
  const absl::Duration bound = timeout < 0    ? me.rpc_timeout()
                               : timeout == 0 ? absl::InfiniteDuration()
                                              : absl::Seconds(timeout);
  absl::StatusOr<std::map<std::string, c10::IValue>> gathered;
  {
    py::gil_scoped_release nogil;
    gathered = me.all_gather(std::move(v), std::move(names), bound);
  }
  py::dict out;
  for (const auto& [name, each] : value_or_throw(std::move(gathered))) {
    out[py::str(name)] = to_python(each);
  }
  return out;
}

// RRef.backward(dist_autograd_ctx_id=-1, retain_graph=False), as the
// peer's: -1 is a local backward pass on the owner; otherwise the
// distributed pass of that context, run on the owner.
void rref_backward(const RRef& self, int64_t context_id, bool retain_graph) {
  if (context_id != -1) {
    absl::Status done;
    {
      py::gil_scoped_release nogil;
      done = tether::autograd::backward(self, context_id, retain_graph);
    }
    check(done);
    return;
  }
  if (!self.is_owner()) {
    throw RpcError(absl::FailedPreconditionError(
        "User RRefs require 'dist_autograd_ctx_id' to be specified: "
        "RRef.backward() without it runs a local backward pass, which only "
        "the RRef's owner '" + self.owner_name() + "' can do"));
  }
  absl::StatusOr<c10::IValue> value;
  {
    py::gil_scoped_release nogil;
    value = self.local_value();
  }
  c10::IValue v = value_or_throw(std::move(value));
  if (!v.isTensor()) {
    // The peer's text, which its programs match.
    throw RpcError(absl::InvalidArgumentError(
        std::string("RRef should contain a tensor for .backward(); this "
                    "one holds a ") + v.tagKind()));
  }
  py::object tensor = to_python(v);
  py::module_::import("torch.autograd")
      .attr("backward")(tensor, py::arg("retain_graph") = retain_graph);
}

// A method of RRef returning the proxy of `kind` ("rpc_sync", ...).
std::function<py::object(py::object, double)> proxy(const char* kind) {
  return [kind](py::object self, double timeout) {
    return py::module_::import("tether.rpc._proxy")
        .attr("RRefProxy")(self, kind, timeout);
  };
}

std::string worker_repr(const WorkerInfo& info) {
  return "WorkerInfo(id=" + std::to_string(info.id) + ", name=" + info.name +
         ")";
}

// The peer's GloballyUniqueId text, which its programs and tests print.
std::string unique_id(const std::pair<int32_t, int64_t>& id) {
  return "GloballyUniqueId(created_on=" + std::to_string(id.first) +
         ", local_id=" + std::to_string(id.second) + ")";
}

// str() and repr() of an RRef, as the peer's.
std::string rref_repr(const RRef& self) {
  if (self.is_owner()) return "OwnerRRef(" + unique_id(self.id()) + ")";
  return "UserRRef(RRefId = " + unique_id(self.id()) +
         ", ForkId = " + unique_id(self.fork_id()) + ")";
}

// local_value() on a user: the peer's text, naming both workers.
[[noreturn]] void raise_not_owner(const RRef& self) {
  absl::StatusOr<WorkerInfo> me = get_current_worker_info();
  throw RpcError(absl::FailedPreconditionError(
      "For UserRRef(rref_id=" + unique_id(self.id()) +
      ", fork_id=" + unique_id(self.fork_id()) +
      "), can't call localValue() on user " +
      (me.ok() ? worker_repr(*me) : std::string("this worker")) +
      ". Call it on owner " + worker_repr(self.owner()) +
      " (only the owner holds the value; use to_here())"));
}

}  // namespace
}  // namespace tether::python

PYBIND11_MODULE(_C, m) {
  using namespace tether;          // NOLINT
  using namespace tether::python;  // NOLINT
  m.doc() = "tether's C++ core, for tether.rpc (internal)";
  // The C++ library's version, and the LibTorch this was compiled against
  // (tether/__init__.py checks the running torch against the same number,
  // which Bazel wrote into tether/_build.py, before loading this module).
  m.attr("__version__") = kVersion;
  m.attr("_torch_version") = TORCH_VERSION;
  py::module_::import("torch");
  register_object_encoder();
  // THP_MEM_ALLOC_ENABLE=1: tensors made from here on, before init_rpc too,
  // go on huge pages when large. An error shows at init_rpc, which asks
  // again (Worker::create).
  (void)use_huge_pages_if_asked();

  namespace py = pybind11;
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const RpcError& e) {
      raise_python(e.status());
    }
  });

  py::class_<WorkerInfo>(m, "WorkerInfo")
      .def(py::init([](std::string name, int id) {
             check_worker_name(name);
             return WorkerInfo{std::move(name), id};
           }),
           py::arg("name"), py::arg("id"))
      .def_readonly("name", &WorkerInfo::name)
      .def_readonly("id", &WorkerInfo::id)
      .def("__eq__",
           [](const WorkerInfo& a, py::handle b) {
             return py::isinstance<WorkerInfo>(b) && a == b.cast<WorkerInfo>();
           })
      .def("__hash__",
           [](const WorkerInfo& a) {
             return py::hash(py::make_tuple(a.name, a.id));
           })
      .def("__repr__", &worker_repr)
      .def("__str__", &worker_repr);

  // dynamic_attr: tether.rpc caches the value's type on the object
  // (_get_type).
  py::class_<PyCompletion, std::shared_ptr<PyCompletion>>(m, "_Completion")
      .def("help", &PyCompletion::help);

  py::class_<RRef>(m, "RRef", py::dynamic_attr())
      .def(py::init([](py::handle value) {
             c10::IValue v = to_ivalue(value, Objects::kKeep, "the value");
             absl::StatusOr<RRef> rref;
             {
               py::gil_scoped_release nogil;
               rref = RRef::local(std::move(v));
             }
             return value_or_throw(std::move(rref));
           }),
           py::arg("value"))
      .def(
          "to_here",
          [](const RRef& self, double timeout) {
            absl::StatusOr<c10::IValue> value;
            {
              py::gil_scoped_release nogil;
              value = self.to_here(to_duration(timeout));
            }
            return to_python(value_or_throw(std::move(value)));
          },
          py::arg("timeout") = -1.0)
      .def("local_value",
           [](const RRef& self) {
             if (!self.is_owner()) raise_not_owner(self);
             absl::StatusOr<c10::IValue> value;
             {
               // The owner's value may still be on its way (a remote() to
               // this worker whose Python function waits for the GIL).
               py::gil_scoped_release nogil;
               value = self.local_value();
             }
             return to_python(value_or_throw(std::move(value)));
           })
      .def("owner", &RRef::owner)
      .def("owner_name", &RRef::owner_name)
      .def("is_owner", &RRef::is_owner)
      .def("confirmed_by_owner", &RRef::confirmed_by_owner)
      .def("backward", &rref_backward, py::arg("dist_autograd_ctx_id") = -1,
           py::arg("retain_graph") = false)
      // The peer's proxies: rref.rpc_sync().method(*args) runs
      // getattr(value, "method")(*args) on the owner (tether.rpc._proxy).
      .def("rpc_sync", proxy("rpc_sync"), py::arg("timeout") = -1.0)
      .def("rpc_async", proxy("rpc_async"), py::arg("timeout") = -1.0)
      .def("remote", proxy("remote"), py::arg("timeout") = -1.0)
      // The peer's rref._get_future(): completes with None once the value
      // exists on its owner, or with the error its creation met (the
      // remote() call's own, a timeout included); RRef::get_future().
      .def("_get_future",
           [](const RRef& self) {
             Future<c10::IValue> created = self.get_future().then(
                 [](const absl::StatusOr<bool>& made)
                     -> absl::StatusOr<c10::IValue> {
                   if (!made.ok()) return made.status();
                   return c10::IValue();
                 });
             return python_future(std::move(created));
           })
      .def(
          "_get_type",
          [](py::object self, double timeout, bool blocking) {
            return py::module_::import("tether.rpc._proxy")
                .attr("get_type")(self, timeout, blocking);
          },
          py::arg("timeout") = -1.0, py::arg("blocking") = true)
      .def("__repr__", &rref_repr)
      .def("__str__", &rref_repr);

  m.def("init_rpc", &tether::python::init_rpc, py::arg("name"), py::arg("rank"),
        py::arg("world_size"), py::arg("backend"), py::arg("init_method"),
        py::arg("num_worker_threads"), py::arg("rpc_timeout"),
        py::arg("init_timeout"), py::arg("backend_settings"),
        py::arg("auth_secret"), py::arg("serve"), py::arg("failure"),
        py::arg("busy_poll") = 0.0, py::arg("spare_core_poll") = 100e-6);
  m.def(
      "shutdown",
      [](bool graceful, double timeout) {
        absl::Status down;
        {
          py::gil_scoped_release nogil;
          // 0: no bound (the peer's DEFAULT_SHUTDOWN_TIMEOUT).
          down = tether::shutdown(graceful, timeout > 0
                                                ? absl::Seconds(timeout)
                                                : absl::InfiniteDuration());
        }
        check(down);
      },
      py::arg("graceful") = true, py::arg("timeout") = 0.0);
  m.def("get_rpc_timeout", [] {
    return absl::ToDoubleSeconds(value_or_throw(tether::get_rpc_timeout()));
  });
  m.def(
      "set_rpc_timeout",
      [](double seconds) {
        if (!(seconds >= 0)) {
          throw py::value_error("rpc_timeout must be >= 0 seconds (0: none), "
                                "got " + std::to_string(seconds));
        }
        check(tether::set_rpc_timeout(absl::Seconds(seconds)));
      },
      py::arg("rpc_timeout"));
  m.def("is_initialized", [] { return current_worker() != nullptr; });
  m.def("rpc_sync", &tether::python::rpc_sync);
  m.def("rpc_async", &tether::python::rpc_async);
  m.def("remote", &tether::python::remote);
  m.def("get_worker_info", [](py::handle to) {
    if (to.is_none()) return value_or_throw(get_current_worker_info());
    return value_or_throw(get_worker_info(to_target(to)));
  });
  // The peer's agent.get_debug_info(): the keys tether has, values as text.
  m.def("agent_debug_info", [] {
    const Worker::PoolInfo pool = worker_or_throw().pool_info();
    py::dict out;
    out["agent.thread_pool_size"] = std::to_string(pool.threads);
    out["agent.num_idle_threads"] = std::to_string(pool.idle);
    const GilProfile& gil = GilProfile::get();
    if (gil.on.load()) {
      const int64_t waits = gil.waits.load();
      out["agent.gil_average_wait_time_us"] = std::to_string(
          waits == 0 ? 0 : gil.wait_ns.load() / waits / 1000);
    }
    return out;
  });
  // The peer's rpc._server_process_global_profile (profiling::ServerProfiles):
  // start returns the profile's id; stop returns one list of LibTorch
  // events (torch._C._autograd.ProfilerEvent) per request served meanwhile.
  m.def("server_profile_start", [](bool record_shapes, bool profile_memory,
                                   bool with_stack, bool with_flops,
                                   bool with_modules) {
    wire::ProfilerSettings settings;
    settings.record_shapes = record_shapes;
    settings.profile_memory = profile_memory;
    settings.with_stack = with_stack;
    settings.with_flops = with_flops;
    settings.with_modules = with_modules;
    return profiling::ServerProfiles::start(settings);
  });
  m.def("server_profile_stop", [](int64_t id) {
    return py::cast(profiling::ServerProfiles::stop(id));
  });
  m.def("enable_gil_profiling", [](bool on) {
    GilProfile::get().on.store(on);
  });
  // The peer's _rref_context_get_debug_info(): its keys, values as text.
  m.def("rref_debug_info", [] {
    Worker& me = worker_or_throw();
    absl::StatusOr<RRefDebugInfo> info;
    {
      py::gil_scoped_release nogil;
      info = rref_debug_info(me);
    }
    const RRefDebugInfo counts = value_or_throw(std::move(info));
    py::dict out;
    out["num_owner_rrefs"] = std::to_string(counts.owners);
    out["num_pending_futures"] = std::to_string(counts.pending_children);
    out["num_pending_users"] = std::to_string(counts.pending_users);
    out["num_forks"] = std::to_string(counts.forks);
    return out;
  });
  m.def("all_gather", &gather, py::arg("value"), py::arg("names"),
        py::arg("timeout"));
  m.def("get_all_worker_infos",
        [] { return value_or_throw(tether::get_all_worker_infos()); });
  // (ip, port) where `worker` listens, or None (Paddle's WorkerInfo.ip and
  // .port; Agent::endpoint_of).
  m.def("endpoint_of", [](const WorkerInfo& worker) -> py::object {
    Worker& me = worker_or_throw();
    absl::StatusOr<std::optional<Endpoint>> endpoint;
    {
      py::gil_scoped_release nogil;  // a store read
      endpoint = me.endpoint_of(worker);
    }
    std::optional<Endpoint> found = value_or_throw(std::move(endpoint));
    if (!found.has_value()) return py::none();
    return py::make_tuple(found->ip, found->port);
  });
  bind_training(m);
  bind_script(m);
}

