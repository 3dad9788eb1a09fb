#include "core/toolkit/usable_cores.h"

#include <gtest/gtest.h>
#include <sys/stat.h>  // mkdir
#include <sys/sysinfo.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

namespace tether {
namespace {

using internal::QuotaDir;

TEST(QuotaTest, WholeCoresRoundedUp) {
  EXPECT_EQ(internal::cores_of_cpu_max("150000 100000\n"), 2);
  EXPECT_EQ(internal::cores_of_cpu_max("100000 100000"), 1);
  EXPECT_EQ(internal::cores_of_cpu_max("50000 100000"), 1);
  EXPECT_EQ(internal::cores_of_cfs("250000\n", "100000\n"), 3);
}

TEST(QuotaTest, NoLimitAndOtherTextAreNoQuota) {
  EXPECT_EQ(internal::cores_of_cpu_max("max 100000\n"), std::nullopt);
  EXPECT_EQ(internal::cores_of_cpu_max(""), std::nullopt);
  EXPECT_EQ(internal::cores_of_cpu_max("100000"), std::nullopt);
  EXPECT_EQ(internal::cores_of_cpu_max("0 100000"), std::nullopt);
  EXPECT_EQ(internal::cores_of_cfs("-1\n", "100000\n"), std::nullopt);
  EXPECT_EQ(internal::cores_of_cfs("x", "100000"), std::nullopt);
}

// A host with v1 hierarchies and a v2 one beside them: the cpu controller's
// groups from the process's own up, then v2's top.
TEST(QuotaDirsTest, HybridHierarchies) {
  const std::string mountinfo =
      "22 27 0:21 / /proc rw,relatime - proc proc rw\n"
      "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup "
      "rw,cpu,cpuacct\n"
      "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup "
      "rw,memory\n"
      "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 "
      "rw\n";
  const std::string groups =
      "4:memory:/jobs/x\n2:cpu,cpuacct:/jobs/x\n0::/\n";
  EXPECT_EQ(internal::quota_dirs(mountinfo, groups),
            (std::vector<QuotaDir>{
                {"/sys/fs/cgroup/cpu,cpuacct/jobs/x", false},
                {"/sys/fs/cgroup/cpu,cpuacct/jobs", false},
                {"/sys/fs/cgroup/cpu,cpuacct", false},
                {"/sys/fs/cgroup/unified", true},
            }));
}

// A container whose mount's top is its own group: paths below the top are
// read from the mount; a group outside the top reads the top alone.
TEST(QuotaDirsTest, AContainersMountStartsAtItsGroup) {
  const std::string mountinfo =
      "700 650 0:40 /docker/abc /sys/fs/cgroup ro,nosuid - cgroup2 cgroup "
      "rw,nsdelegate\n";
  EXPECT_EQ(internal::quota_dirs(mountinfo, "0::/docker/abc/worker\n"),
            (std::vector<QuotaDir>{{"/sys/fs/cgroup/worker", true},
                                   {"/sys/fs/cgroup", true}}));
  EXPECT_EQ(internal::quota_dirs(mountinfo, "0::/docker/abc\n"),
            (std::vector<QuotaDir>{{"/sys/fs/cgroup", true}}));
  EXPECT_EQ(internal::quota_dirs(mountinfo, "0::/elsewhere\n"),
            (std::vector<QuotaDir>{{"/sys/fs/cgroup", true}}));
  EXPECT_TRUE(internal::quota_dirs(mountinfo, "").empty());
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

bool write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.flush();
  return static_cast<bool>(out);
}

// The real thing: a child process moved into a new group with a quota of
// half a core counts one core. Needs a cpu controller this process may
// create groups in (root, cgroup v1 or v2 with cpu enabled); elsewhere the
// test is skipped, saying why.
TEST(UsableCoresTest, AGroupsQuotaLimitsTheCores) {
  if (::get_nprocs() < 2) GTEST_SKIP() << "one core: a quota cannot lower it";
  const std::vector<QuotaDir> dirs = internal::quota_dirs(
      read_text("/proc/self/mountinfo"), read_text("/proc/self/cgroup"));
  std::string group;
  bool v2 = false;
  for (const QuotaDir& where : dirs) {
    const std::string candidate =
        where.dir + "/tether-usable-cores-test-" + std::to_string(::getpid());
    if (::mkdir(candidate.c_str(), 0755) != 0) continue;
    if (where.v2 ? write_text(candidate + "/cpu.max", "50000 100000")
                 : write_text(candidate + "/cpu.cfs_period_us", "100000") &&
                       write_text(candidate + "/cpu.cfs_quota_us", "50000")) {
      group = candidate;
      v2 = where.v2;
      break;
    }
    ::rmdir(candidate.c_str());
  }
  if (group.empty()) {
    GTEST_SKIP() << "no cpu control group this process may create";
  }
  int answer[2];
  ASSERT_EQ(::pipe(answer), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0) << std::strerror(errno);
  if (child == 0) {
    ::close(answer[0]);
    int cores = -1;
    if (write_text(group + "/cgroup.procs", std::to_string(::getpid()))) {
      cores = usable_cores();
    }
    (void)!::write(answer[1], &cores, sizeof(cores));
    ::_exit(0);
  }
  ::close(answer[1]);
  int cores = -2;
  const ssize_t got = ::read(answer[0], &cores, sizeof(cores));
  ::close(answer[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  ::rmdir(group.c_str());
  ASSERT_EQ(got, static_cast<ssize_t>(sizeof(cores)));
  ASSERT_NE(cores, -1) << "the child could not join " << group;
  EXPECT_EQ(cores, 1) << "in " << group << (v2 ? " (v2)" : " (v1)");
  EXPECT_GE(usable_cores(), 1);
  EXPECT_LE(usable_cores(), ::get_nprocs());
}

}  // namespace
}  // namespace tether
