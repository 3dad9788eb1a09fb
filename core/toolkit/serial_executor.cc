#include "core/toolkit/serial_executor.h"

#include <utility>

#include "core/toolkit/check.h"

namespace tether::internal {

SerialExecutor::SerialExecutor() : thread_([this] { run(); }) {}

SerialExecutor::~SerialExecutor() { stop(); }

bool SerialExecutor::post(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return false;
  tasks_.push_back(std::move(task));
  return true;
}

void SerialExecutor::stop() {
  TETHER_CHECK(!in_thread(), "SerialExecutor::stop() on its own thread");
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

bool SerialExecutor::in_thread() const {
  return std::this_thread::get_id() == thread_.get_id();
}

void SerialExecutor::run() {
  absl::MutexLock lock(&mu_);
  while (true) {
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || !tasks_.empty();
    };
    mu_.Await(absl::Condition(&ready));
    if (tasks_.empty()) return;  // stopping, and nothing left to run
    std::function<void()> task = std::move(tasks_.front());
    tasks_.pop_front();
    mu_.Unlock();
    task();
    task = nullptr;  // drop its captures outside the lock too
    mu_.Lock();
  }
}

}  // namespace tether::internal
