// Directories for the checkpoint tests: a fresh one under the test's
// temporary directory, and what one holds.
#ifndef TETHER_TETHER_INTERNAL_CHECKPOINT_TESTING_H_
#define TETHER_TETHER_INTERNAL_CHECKPOINT_TESTING_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

namespace tether::internal {

// `name` in the test's temporary directory, empty.
inline std::string fresh_dir(const std::string& name) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / name;
  std::filesystem::remove_all(dir);
  return dir.string();
}

// The names in `dir`, sorted.
inline std::vector<std::string> files_of(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    out.push_back(entry.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace tether::internal

#endif  // TETHER_TETHER_INTERNAL_CHECKPOINT_TESTING_H_
