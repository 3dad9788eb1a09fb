// Lifeline<T>: a way back to an object that may go away while others still
// hold the way: a layer's state that the references it made outlive (the
// RRef layer's, distributed autograd's), a function's future that completes
// after its Worker is gone. The object's owner closes the lifeline before
// it destroys the object; whoever holds it runs code with the object
// through use(), which does nothing once the lifeline is closed.
//
// Thread safety: use() and close() may be called from any thread; uses run
// concurrently. close() must not be called from inside a use() (it would
// wait for itself).
#ifndef TETHER_CORE_TOOLKIT_LIFELINE_H_
#define TETHER_CORE_TOOLKIT_LIFELINE_H_

#include <absl/base/thread_annotations.h>
#include <absl/synchronization/mutex.h>

#include <utility>

namespace tether::internal {

template <typename T>
class Lifeline {
 public:
  explicit Lifeline(T& object) : object_(&object) {}
  Lifeline(const Lifeline&) = delete;
  Lifeline& operator=(const Lifeline&) = delete;

  // Runs fn(object) unless closed; true if it ran. The object stays alive
  // until fn returns (or throws): close() waits for it.
  template <typename F>
  bool use(F&& fn) {
    T* object;
    {
      absl::MutexLock lock(&mu_);
      if (object_ == nullptr) return false;
      object = object_;
      ++in_use_;
    }
    Release release{this};
    std::forward<F>(fn)(*object);
    return true;
  }

  // The object is going away: refuses uses from now on and waits for the
  // ones running to return.
  void close() {
    absl::MutexLock lock(&mu_);
    object_ = nullptr;
    mu_.Await(absl::Condition(
        +[](int* in_use) { return *in_use == 0; }, &in_use_));
  }

 private:
  // Ends a use when it leaves scope, also by an exception.
  struct Release {
    Lifeline* lifeline;
    ~Release() {
      absl::MutexLock lock(&lifeline->mu_);
      --lifeline->in_use_;
    }
  };

  absl::Mutex mu_;
  T* object_ ABSL_GUARDED_BY(mu_);
  int in_use_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tether::internal

#endif  // TETHER_CORE_TOOLKIT_LIFELINE_H_
