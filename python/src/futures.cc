#include "python/src/futures.h"

#include <absl/synchronization/mutex.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/jit/python/python_ivalue.h>

#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "python/src/convert.h"
#include "python/src/status.h"

namespace tether::python {
namespace {

// Runs completions of Python futures (turning values into Python objects,
// the user's `then` / `add_done_callback` callbacks) on threads of its own,
// started in the order they come. A callback may wait for another tether future
// (`fut.then(lambda f: rpc_async(...).wait())`, as the peer's programs
// do): the completion it waits for must not queue behind it, so a job that
// finds no idle thread starts one. Threads stay for later completions; their
// number is the most callbacks ever blocked at once, plus one.
class Completer {
 public:
  static Completer& get() {
    // Leaked: the threads may still wait when the interpreter exits.
    static Completer* completer = new Completer();
    return *completer;
  }

  void post(std::function<void()> job) {
    bool start_thread = false;
    {
      absl::MutexLock lock(&mu_);
      jobs_.push_back(std::move(job));
      if (idle_ < jobs_.size()) {
        start_thread = true;
        ++idle_;  // the new thread counts as idle until it takes a job
      }
    }
    if (start_thread) std::thread([this] { run(); }).detach();
  }

 private:
  Completer() = default;

  void run() {
    for (;;) {
      std::function<void()> job;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(
            +[](std::deque<std::function<void()>>* jobs) {
              return !jobs->empty();
            },
            &jobs_));
        job = std::move(jobs_.front());
        jobs_.pop_front();
        --idle_;
      }
      job();
      absl::MutexLock lock(&mu_);
      ++idle_;
    }
  }

  absl::Mutex mu_;
  std::deque<std::function<void()>> jobs_ ABSL_GUARDED_BY(mu_);
  // Threads waiting for a job, or started and about to.
  size_t idle_ ABSL_GUARDED_BY(mu_) = 0;
};

// A value that torch's own future turns into the Python object to_python()
// makes (torch::jit::toPyObject, when it is read): a tensor, None, a bool,
// int, float or str, or a tuple or list of them. Most results of builtin
// operators are.
bool torch_converts_alike(const c10::IValue& value, int depth = 0) {
  if (value.isTensor() || value.isNone() || value.isBool() || value.isInt() ||
      value.isDouble() || value.isString()) {
    return true;
  }
  if (depth > 0) return false;
  if (value.isTuple()) {
    for (const c10::IValue& element : value.toTupleRef().elements()) {
      if (!torch_converts_alike(element, depth + 1)) return false;
    }
    return true;
  }
  if (value.isList()) {
    for (const c10::IValue& element : value.toListRef()) {
      if (!torch_converts_alike(element, depth + 1)) return false;
    }
    return true;
  }
  return false;
}

}  // namespace

void PyCompletion::finish(const absl::StatusOr<c10::IValue>& result) {
  if (!result.ok()) {
    jit->setError(std::make_exception_ptr(RpcError(result.status())));
    return;
  }
  // Kept as it is, the value needs no GIL now: torch converts it when it
  // is read, as the peer's futures do.
  if (torch_converts_alike(*result)) {
    jit->markCompleted(*result);
    return;
  }
  c10::IValue value;
  std::string error;
  {
    py::gil_scoped_acquire gil;
    try {
      value = c10::IValue(
          c10::ivalue::ConcretePyObjectHolder::create(to_python(*result)));
    } catch (const std::exception& e) {
      error = std::string("cannot convert the result: ") + e.what();
    }
  }
  if (!error.empty()) {
    jit->setError(
        std::make_exception_ptr(RpcError(absl::InternalError(error))));
    return;
  }
  jit->markCompleted(std::move(value));
}

void PyCompletion::help() {
  py::gil_scoped_release nogil;
  waited.store(true);
  (void)future.wait(absl::InfiniteFuture());
  if (claimed.exchange(true)) return;
  finish(future.result());
}

py::object python_future(Future<c10::IValue> future) {
  // Guarded by the GIL, not by a function-local static's guard: the import
  // may let another thread take the GIL, which would then wait for that
  // guard holding the GIL. Leaked: the class lives as long as the
  // interpreter.
  static py::object* rpc_future = nullptr;
  if (rpc_future == nullptr) {
    py::object cls =
        py::module_::import("tether.rpc._future").attr("RpcFuture");
    if (rpc_future == nullptr) rpc_future = new py::object(std::move(cls));
  }
  auto completion = std::make_shared<PyCompletion>();
  completion->future = future;
  py::object out = (*rpc_future)(completion);
  completion->jit =
      py::cast<std::shared_ptr<torch::jit::PythonFutureWrapper>>(out)->fut;
  {
    py::gil_scoped_release nogil;
    future.on_complete(
        [completion](const absl::StatusOr<c10::IValue>& result) {
          if (completion->waited.load()) return;
          Completer::get().post([completion, result] {
            if (!completion->claimed.exchange(true)) {
              completion->finish(result);
            }
          });
        });
  }
  return out;
}

}  // namespace tether::python
