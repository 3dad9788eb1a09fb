#include "core/toolkit/usable_cores.h"

#include <absl/strings/ascii.h>
#include <absl/strings/match.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_split.h>
#include <absl/strings/string_view.h>

#include <sched.h>
#include <sys/sysinfo.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <sstream>

namespace tether {
namespace internal {
namespace {

std::optional<int> whole_cores(int64_t quota, int64_t period) {
  if (quota <= 0 || period <= 0) return std::nullopt;
  return static_cast<int>((quota + period - 1) / period);
}

bool has_item(absl::string_view list, absl::string_view item) {
  for (absl::string_view each : absl::StrSplit(list, ',')) {
    if (each == item) return true;
  }
  return false;
}

// The directories from `mount` + (path below `root`) up to `mount`.
void add_dirs(absl::string_view mount, absl::string_view root,
              absl::string_view path, bool v2, std::vector<QuotaDir>& out) {
  std::string below;
  if (root == "/") {
    below = std::string(path);
  } else if (path == root) {
    below = "/";
  } else if (absl::StartsWith(path, root) && path.size() > root.size() &&
             path[root.size()] == '/') {
    below = std::string(path.substr(root.size()));
  } else {
    below = "/";  // the group is outside this mount: its top alone
  }
  std::vector<absl::string_view> parts =
      absl::StrSplit(below, '/', absl::SkipEmpty());
  for (size_t keep = parts.size() + 1; keep-- > 0;) {
    std::string dir(mount);
    for (size_t i = 0; i < keep; ++i) {
      dir += '/';
      dir += std::string(parts[i]);
    }
    out.push_back(QuotaDir{std::move(dir), v2});
  }
}

}  // namespace

std::optional<int> cores_of_cpu_max(absl::string_view cpu_max) {
  std::vector<absl::string_view> fields = absl::StrSplit(
      absl::StripAsciiWhitespace(cpu_max), ' ', absl::SkipEmpty());
  int64_t quota = 0;
  int64_t period = 0;
  if (fields.size() != 2 || !absl::SimpleAtoi(fields[0], &quota) ||
      !absl::SimpleAtoi(fields[1], &period)) {
    return std::nullopt;  // "max 100000" or not a quota
  }
  return whole_cores(quota, period);
}

std::optional<int> cores_of_cfs(absl::string_view quota_us,
                                absl::string_view period_us) {
  int64_t quota = 0;
  int64_t period = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(quota_us), &quota) ||
      !absl::SimpleAtoi(absl::StripAsciiWhitespace(period_us), &period)) {
    return std::nullopt;
  }
  return whole_cores(quota, period);  // -1: no limit
}

std::vector<QuotaDir> quota_dirs(absl::string_view mountinfo,
                                 absl::string_view proc_cgroup) {
  // The process's group: v2's line is "0::/path", v1's "N:cpu,cpuacct:/path".
  std::optional<std::string> v2_path;
  std::optional<std::string> v1_cpu_path;
  for (absl::string_view line : absl::StrSplit(proc_cgroup, '\n')) {
    std::vector<absl::string_view> fields = absl::StrSplit(line, ':');
    if (fields.size() < 3) continue;
    // A path may hold ':'; it is everything after the second one.
    const absl::string_view path =
        line.substr(fields[0].size() + fields[1].size() + 2);
    if (fields[0] == "0" && fields[1].empty()) {
      v2_path = std::string(path);
    } else if (has_item(fields[1], "cpu")) {
      v1_cpu_path = std::string(path);
    }
  }
  std::vector<QuotaDir> dirs;
  // A mount's line: "id parent dev root mountpoint options ... - type
  // source superoptions".
  for (absl::string_view line : absl::StrSplit(mountinfo, '\n')) {
    const size_t dash = line.find(" - ");
    if (dash == absl::string_view::npos) continue;
    std::vector<absl::string_view> before =
        absl::StrSplit(line.substr(0, dash), ' ', absl::SkipEmpty());
    std::vector<absl::string_view> after =
        absl::StrSplit(line.substr(dash + 3), ' ', absl::SkipEmpty());
    if (before.size() < 5 || after.size() < 3) continue;
    const absl::string_view root = before[3];
    const absl::string_view mount = before[4];
    if (after[0] == "cgroup2" && v2_path.has_value()) {
      add_dirs(mount, root, *v2_path, true, dirs);
    } else if (after[0] == "cgroup" && v1_cpu_path.has_value() &&
               has_item(after[2], "cpu")) {
      add_dirs(mount, root, *v1_cpu_path, false, dirs);
    }
  }
  return dirs;
}

}  // namespace internal

namespace {

std::optional<std::string> read_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::optional<int> quota_cores() {
  const std::optional<std::string> mountinfo =
      read_file("/proc/self/mountinfo");
  const std::optional<std::string> groups = read_file("/proc/self/cgroup");
  if (!mountinfo.has_value() || !groups.has_value()) return std::nullopt;
  std::optional<int> fewest;
  for (const internal::QuotaDir& where :
       internal::quota_dirs(*mountinfo, *groups)) {
    std::optional<int> cores;
    if (where.v2) {
      if (std::optional<std::string> max = read_file(where.dir + "/cpu.max")) {
        cores = internal::cores_of_cpu_max(*max);
      }
    } else {
      std::optional<std::string> quota =
          read_file(where.dir + "/cpu.cfs_quota_us");
      std::optional<std::string> period =
          read_file(where.dir + "/cpu.cfs_period_us");
      if (quota.has_value() && period.has_value()) {
        cores = internal::cores_of_cfs(*quota, *period);
      }
    }
    if (cores.has_value() && (!fewest.has_value() || *cores < *fewest)) {
      fewest = cores;
    }
  }
  return fewest;
}

}  // namespace

int usable_cores() {
  int cores = ::get_nprocs();
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (::sched_getaffinity(0, sizeof(allowed), &allowed) == 0 &&
      CPU_COUNT(&allowed) > 0) {
    cores = std::min(cores, CPU_COUNT(&allowed));
  }
  if (std::optional<int> quota = quota_cores()) {
    cores = std::min(cores, *quota);
  }
  return std::max(cores, 1);
}

}  // namespace tether
