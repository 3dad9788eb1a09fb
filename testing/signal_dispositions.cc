#include "testing/signal_dispositions.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <dlfcn.h>
#include <signal.h>

#include <cstdlib>
#include <cstring>
#include <fstream>

namespace tether::testing {
namespace {

constexpr int kLastSignal = 64;
// The kernel's SA_RESTORER (x86-64 and most Linux ABIs), which glibc sets
// on every handler it installs and does not define for programs.
constexpr uint64_t kSaRestorer = 0x04000000;

// The number and, for the classic signals, the name: "SIGTERM (15)".
std::string signal_name(int signal) {
  const char* abbreviation = sigabbrev_np(signal);
  if (abbreviation == nullptr) return absl::StrCat("signal ", signal);
  return absl::StrCat("SIG", abbreviation, " (", signal, ")");
}

// The signals set in a hexadecimal mask of /proc/self/status, glibc's own
// 32 and 33 left out.
std::vector<int> mask_signals(const std::string& hex) {
  const uint64_t mask = std::strtoull(hex.c_str(), nullptr, 16);
  std::vector<int> signals;
  for (int signal = 1; signal <= kLastSignal; ++signal) {
    if (signal == 32 || signal == 33) continue;
    if ((mask >> (signal - 1)) & 1) signals.push_back(signal);
  }
  return signals;
}

}  // namespace

bool SignalDisposition::is_default() const {
  return handler == reinterpret_cast<uintptr_t>(SIG_DFL);
}

bool SignalDisposition::is_ignored() const {
  return handler == reinterpret_cast<uintptr_t>(SIG_IGN);
}

std::string SignalDisposition::describe() const {
  if (is_default()) return "default";
  if (is_ignored()) return "ignored";
  std::string text = absl::StrCat("handler 0x", absl::Hex(handler));
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(handler), &info) != 0 &&
      info.dli_fname != nullptr) {
    const char* slash = std::strrchr(info.dli_fname, '/');
    absl::StrAppend(&text, " in ", slash != nullptr ? slash + 1 : info.dli_fname);
    if (info.dli_sname != nullptr) absl::StrAppend(&text, " (", info.dli_sname, ")");
  }
  absl::StrAppend(&text, " flags 0x", absl::Hex(flags));
  return text;
}

bool SignalDisposition::operator==(const SignalDisposition& other) const {
  // Flags matter only for a handler: the kernel keeps whatever flags came
  // with SIG_DFL or SIG_IGN, and they do nothing.
  return signal == other.signal && handler == other.handler &&
         (!is_caught() || flags == other.flags);
}

std::vector<SignalDisposition> signal_dispositions() {
  std::vector<SignalDisposition> snapshot;
  for (int signal = 1; signal <= kLastSignal; ++signal) {
    struct sigaction action {};
    if (::sigaction(signal, nullptr, &action) != 0) continue;
    SignalDisposition disposition;
    disposition.signal = signal;
    disposition.handler = reinterpret_cast<uintptr_t>(action.sa_handler);
    disposition.flags = static_cast<uint64_t>(action.sa_flags) &
                        ~kSaRestorer;
    snapshot.push_back(disposition);
  }
  return snapshot;
}

std::string signal_changes(const std::vector<SignalDisposition>& before,
                           const std::vector<SignalDisposition>& after,
                           bool allow_sigpipe_ignored) {
  std::vector<std::string> lines;
  if (before.size() != after.size()) {
    lines.push_back(absl::StrCat("snapshots of ", before.size(), " and ",
                                 after.size(), " signals"));
  }
  for (size_t i = 0; i < before.size() && i < after.size(); ++i) {
    const SignalDisposition& was = before[i];
    const SignalDisposition& is = after[i];
    if (was == is) continue;
    if (allow_sigpipe_ignored && was.signal == SIGPIPE && was.is_default() &&
        is.is_ignored()) {
      continue;
    }
    lines.push_back(absl::StrCat(signal_name(was.signal), ": ", was.describe(),
                                 " -> ", is.describe()));
  }
  return absl::StrJoin(lines, "\n");
}

std::vector<int> caught_signals(const std::vector<SignalDisposition>& snapshot) {
  std::vector<int> caught;
  for (const SignalDisposition& disposition : snapshot) {
    if (disposition.is_caught()) caught.push_back(disposition.signal);
  }
  return caught;
}

std::string proc_signal_sets() {
  std::ifstream status("/proc/self/status");
  std::string line;
  std::string caught;
  std::string ignored;
  while (std::getline(status, line)) {
    if (line.rfind("SigCgt:", 0) == 0) {
      caught = absl::StrJoin(mask_signals(line.substr(7)), ",");
    } else if (line.rfind("SigIgn:", 0) == 0) {
      ignored = absl::StrJoin(mask_signals(line.substr(7)), ",");
    }
  }
  return absl::StrCat("SigCgt {", caught, "} SigIgn {", ignored, "}");
}

bool library_mapped(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    // The file's name must start with `name`.
    const size_t slash = line.rfind('/');
    if (slash != std::string::npos &&
        line.compare(slash + 1, name.size(), name) == 0) {
      return true;
    }
  }
  return false;
}

}  // namespace tether::testing
