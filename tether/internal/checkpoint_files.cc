#include "tether/internal/checkpoint_files.h"

#include <absl/strings/ascii.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_split.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <filesystem>
#include <system_error>

namespace tether::internal {
namespace {

namespace fs = std::filesystem;

constexpr char kStepPrefix[] = "step-";
constexpr char kManifestHeader[] = "tether checkpoint 1";

absl::Status errno_status(int error, absl::string_view what,
                          absl::string_view path) {
  return absl::ErrnoToStatus(error, absl::StrCat(what, " '", path, "'"));
}

absl::Status error_code_status(const std::error_code& error,
                               absl::string_view what, absl::string_view path) {
  return errno_status(error.value(), what, path);
}

// A worker name as a part of a file name (see part_file).
std::string escape(absl::string_view name) {
  std::string out;
  for (size_t i = 0; i < name.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(name[i]);
    if (absl::ascii_isalnum(c) || c == '_' || c == '-' || (c == '.' && i > 0)) {
      out += static_cast<char>(c);
    } else {
      absl::StrAppendFormat(&out, "%%%02X", c);
    }
  }
  return out;
}

std::optional<std::string> unescape(absl::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') {
      out += text[i];
      continue;
    }
    int value = 0;
    if (i + 2 >= text.size()) return std::nullopt;
    if (!absl::SimpleHexAtoi(text.substr(i + 1, 2), &value))
      return std::nullopt;
    out += static_cast<char>(value);
    i += 2;
  }
  return out;
}

absl::Status fsync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno_status(errno, "cannot open the directory", dir);
  const int synced = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  if (synced != 0) return errno_status(error, "cannot fsync", dir);
  return absl::OkStatus();
}

std::string parent_of(const std::string& path) {
  const std::string parent = fs::path(path).parent_path().string();
  return parent.empty() ? "." : parent;
}

// Writes all of `bytes` to `fd` and fsyncs it.
absl::Status write_and_sync(int fd, absl::string_view bytes,
                            const std::string& path) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_status(errno, "cannot write", path);
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  if (::fsync(fd) != 0) return errno_status(errno, "cannot fsync", path);
  return absl::OkStatus();
}

}  // namespace

std::string normal_directory(absl::string_view dir) {
  std::string out = fs::path(std::string(dir)).lexically_normal().string();
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  return out;
}

std::string step_directory(absl::string_view dir, int64_t step) {
  return absl::StrFormat("%s/%s%08d", normal_directory(dir), kStepPrefix, step);
}

std::string part_file(absl::string_view holder, absl::string_view member) {
  if (holder == member) return absl::StrCat(escape(holder), ".pt");
  return absl::StrCat(escape(holder), ".for-", escape(member), ".pt");
}

absl::Status write_file_atomically(const std::string& path,
                                   absl::string_view bytes) {
  static std::atomic<uint64_t> counter{0};
  const std::string dir = parent_of(path);
  const std::string temporary =
      absl::StrCat(dir, "/.", fs::path(path).filename().string(), ".tmp-",
                   ::getpid(), "-", counter.fetch_add(1));
  const int fd =
      ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return errno_status(errno, "cannot create", temporary);
  absl::Status written = write_and_sync(fd, bytes, temporary);
  if (::close(fd) != 0 && written.ok()) {
    written = errno_status(errno, "cannot close", temporary);
  }
  if (written.ok() && ::rename(temporary.c_str(), path.c_str()) != 0) {
    written = errno_status(errno, "cannot rename to", path);
  }
  if (!written.ok()) {
    ::unlink(temporary.c_str());
    return written;
  }
  return fsync_directory(dir);
}

absl::StatusOr<std::string> read_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno_status(errno, "cannot open", path);
  std::string out;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      ::close(fd);
      return errno_status(error, "cannot read", path);
    }
    if (n == 0) break;
    out.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

absl::Status make_directories(const std::string& path) {
  const fs::path target(path);
  fs::path made;
  for (const fs::path& component : target) {
    made /= component;
    std::error_code error;
    if (fs::is_directory(made, error)) continue;
    if (::mkdir(made.c_str(), 0755) != 0 && errno != EEXIST) {
      return errno_status(errno, "cannot make the directory", made.string());
    }
    if (absl::Status synced = fsync_directory(parent_of(made.string()));
        !synced.ok()) {
      return synced;
    }
  }
  return absl::OkStatus();
}

absl::Status remove_step_directory(const std::string& path) {
  std::error_code error;
  fs::remove(fs::path(path) / kCompleteMarker, error);
  if (error)
    return error_code_status(error, "cannot remove the marker of", path);
  fs::remove_all(path, error);
  if (error) return error_code_status(error, "cannot remove", path);
  return fsync_directory(parent_of(path));
}

std::string format_manifest(const Manifest& manifest) {
  std::string out =
      absl::StrCat(kManifestHeader, "\nstep ", manifest.step, "\n");
  for (const std::string& member : manifest.members) {
    absl::StrAppend(&out, "member ", escape(member), "\n");
  }
  for (const auto& [file, bytes] : manifest.files) {
    absl::StrAppend(&out, "file ", file, " ", bytes, "\n");
  }
  return out;
}

absl::StatusOr<Manifest> parse_manifest(absl::string_view text,
                                        absl::string_view where) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", where, "' is not a checkpoint's marker: ", why));
  };
  std::vector<absl::string_view> lines =
      absl::StrSplit(text, '\n', absl::SkipEmpty());
  if (lines.empty() || lines[0] != kManifestHeader) {
    return bad(absl::StrCat("it does not start with '", kManifestHeader, "'"));
  }
  Manifest manifest;
  bool has_step = false;
  for (size_t i = 1; i < lines.size(); ++i) {
    std::vector<absl::string_view> words = absl::StrSplit(lines[i], ' ');
    if (words.size() == 2 && words[0] == "step" &&
        absl::SimpleAtoi(words[1], &manifest.step) && !has_step) {
      has_step = true;
    } else if (words.size() == 2 && words[0] == "member") {
      std::optional<std::string> member = unescape(words[1]);
      if (!member.has_value()) return bad(absl::StrCat("line ", i + 1));
      manifest.members.push_back(*member);
    } else if (int64_t bytes = 0; words.size() == 3 && words[0] == "file" &&
                                  absl::SimpleAtoi(words[2], &bytes) &&
                                  bytes >= 0) {
      manifest.files[std::string(words[1])] = bytes;
    } else {
      return bad(absl::StrCat("line ", i + 1, " is '", lines[i], "'"));
    }
  }
  if (!has_step) return bad("it names no step");
  return manifest;
}

absl::StatusOr<Steps> list_steps(const std::string& dir) {
  Steps steps;
  std::error_code error;
  if (!fs::exists(dir, error)) return steps;
  fs::directory_iterator it(dir, error);
  if (error) return error_code_status(error, "cannot list", dir);
  for (; it != fs::directory_iterator(); it.increment(error)) {
    if (error) return error_code_status(error, "cannot list", dir);
    const std::string name = it->path().filename().string();
    absl::string_view digits(name);
    int64_t step = 0;
    if (!absl::ConsumePrefix(&digits, kStepPrefix) || digits.empty() ||
        digits.size() > 18 ||
        digits.find_first_not_of("0123456789") != absl::string_view::npos ||
        !absl::SimpleAtoi(digits, &step) || !it->is_directory(error)) {
      continue;
    }
    steps.all.push_back(step);
    if (fs::exists(it->path() / kCompleteMarker, error)) {
      steps.complete.push_back(step);
    }
  }
  std::sort(steps.all.begin(), steps.all.end());
  std::sort(steps.complete.begin(), steps.complete.end());
  return steps;
}

}  // namespace tether::internal
