// The files of a checkpoint directory (tether/checkpoint.h): where each part
// goes, the COMPLETE marker that makes a step complete, writing a file so
// that it is there whole or not at all, and finding the newest complete
// step. Only the checkpoint layer uses it.
//
// Thread safety: the functions keep no state; two writers of one path
// leave one of their files.
#ifndef TETHER_TETHER_INTERNAL_CHECKPOINT_FILES_H_
#define TETHER_TETHER_INTERNAL_CHECKPOINT_FILES_H_

#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/strings/string_view.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace tether::internal {

// The marker's name in a step's directory.
inline constexpr char kCompleteMarker[] = "COMPLETE";

// `dir` without "." components, doubled or trailing slashes: the form in
// which members and owners compare the directory they name.
std::string normal_directory(absl::string_view dir);

// "<dir>/step-00000040": steps sort by name up to 10^8.
std::string step_directory(absl::string_view dir, int64_t step);

// The file, in a step's directory, of `member`'s items that `holder` writes:
// "<holder>.pt" for the member's own, "<holder>.for-<member>.pt" for an
// owner's. Worker names keep letters, digits, '_', '-' and '.' (but a
// leading one); any other byte becomes %XX, so no name leaves the
// directory.
std::string part_file(absl::string_view holder, absl::string_view member);

// Writes `bytes` to `path` atomically: to a temporary name in the same
// directory (".<name>.tmp-<pid>-<n>"), fsync, rename over `path`, fsync of
// the directory. After a crash `path` holds its old content or the new,
// never a part of one. Errors carry the errno's code and name the path.
[[nodiscard]] absl::Status write_file_atomically(const std::string& path,
                                                 absl::string_view bytes);

[[nodiscard]] absl::StatusOr<std::string> read_file(const std::string& path);

// mkdir -p; the parent of each directory it makes is fsynced.
[[nodiscard]] absl::Status make_directories(const std::string& path);

// Removes `path` and everything below it (its marker first, so that a crash
// midway leaves an incomplete step, never a complete one with files
// missing).
[[nodiscard]] absl::Status remove_step_directory(const std::string& path);

// What COMPLETE says: the step, the members that saved it (sorted), and
// every part file with its size in bytes.
struct Manifest {
  int64_t step = 0;
  std::vector<std::string> members;
  std::map<std::string, int64_t> files;
};

std::string format_manifest(const Manifest& manifest);
// INVALID_ARGUMENT naming `where` for text that is no manifest.
[[nodiscard]] absl::StatusOr<Manifest> parse_manifest(absl::string_view text,
                                                      absl::string_view where);

// The steps of `dir` (directories "step-<digits>"), ascending, and which of
// them have a marker. A missing `dir` has none.
struct Steps {
  std::vector<int64_t> all;
  std::vector<int64_t> complete;
};
[[nodiscard]] absl::StatusOr<Steps> list_steps(const std::string& dir);

}  // namespace tether::internal

#endif  // TETHER_TETHER_INTERNAL_CHECKPOINT_FILES_H_
