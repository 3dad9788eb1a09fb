// The number of cores this process can keep busy, for deciding whether a
// core is spare (core/toolkit/poll_policy.h): the cores online, fewer when
// its CPU affinity (a taskset, a cpuset) allows fewer, and fewer again when
// its control group's CPU quota allows fewer (a container given "2 CPUs" on
// a large host). The quota is the smallest of the groups from the process's
// own up to the top of the hierarchy it sees, rounded up to whole cores:
// cgroup v2's `cpu.max` ("150000 100000" is 2) and v1's
// `cpu.cfs_quota_us` / `cpu.cfs_period_us`.
#ifndef TETHER_CORE_TOOLKIT_USABLE_CORES_H_
#define TETHER_CORE_TOOLKIT_USABLE_CORES_H_

#include <absl/strings/string_view.h>

#include <optional>
#include <string>
#include <vector>

namespace tether {

// Reads the kernel's files each time (a few small reads): callers keep the
// answer.
int usable_cores();

namespace internal {

// Whole cores of a quota per period, rounded up; nothing for no limit
// (a quota of "max" or -1) or text that is not a quota.
std::optional<int> cores_of_cpu_max(absl::string_view cpu_max);
std::optional<int> cores_of_cfs(absl::string_view quota_us,
                                absl::string_view period_us);

// Where a process's CPU quotas live: one directory per group, from its own
// up to the mount's top, with the version of the hierarchy.
struct QuotaDir {
  std::string dir;
  bool v2 = false;
  bool operator==(const QuotaDir& other) const {
    return dir == other.dir && v2 == other.v2;
  }
};

// From the text of /proc/self/mountinfo (which hierarchies are mounted
// where, and which group each mount's top is) and of /proc/self/cgroup (the
// process's group in each hierarchy). A group outside a mount's top (a
// container that sees only its own group) reads the mount's top alone.
std::vector<QuotaDir> quota_dirs(absl::string_view mountinfo,
                                 absl::string_view proc_cgroup);

}  // namespace internal
}  // namespace tether

#endif  // TETHER_CORE_TOOLKIT_USABLE_CORES_H_
