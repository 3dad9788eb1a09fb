#include "backends/tensorpipe/internal/discard_region.h"

#include <absl/strings/str_cat.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace tether::backends::tensorpipe::internal {
namespace {

constexpr uint64_t kMinBuffer = uint64_t{1} << 20;

absl::Status system_error(const char* what, uint64_t length) {
  return absl::ResourceExhaustedError(
      absl::StrCat("cannot set up ", length, " bytes to discard a message: ",
                   what, ": ", std::strerror(errno)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<DiscardRegion>> DiscardRegion::create(
    uint64_t length) {
  if (length == 0 || length > kMaxLength) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot discard a message of ", length, " bytes (at most ", kMaxLength,
        ")"));
  }
  // A power of two at least 1 MiB, large enough that kMaxMappings of it
  // cover the region.
  uint64_t buffer = kMinBuffer;
  while (buffer * kMaxMappings < length) buffer *= 2;
  const uint64_t mappings = (length + buffer - 1) / buffer;
  const uint64_t reserved = mappings * buffer;

  const int fd = ::memfd_create("tether-discard", MFD_CLOEXEC);
  if (fd < 0) return system_error("memfd_create", length);
  if (::ftruncate(fd, static_cast<off_t>(buffer)) != 0) {
    absl::Status error = system_error("ftruncate", length);
    ::close(fd);
    return error;
  }
  // Reserve the range first, then map the buffer over each piece of it.
  void* base = ::mmap(nullptr, reserved, PROT_NONE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) {
    absl::Status error = system_error("mmap", length);
    ::close(fd);
    return error;
  }
  char* const start = static_cast<char*>(base);
  for (uint64_t i = 0; i < mappings; ++i) {
    void* piece = ::mmap(start + i * buffer, buffer, PROT_READ | PROT_WRITE,
                         MAP_SHARED | MAP_FIXED, fd, 0);
    if (piece == MAP_FAILED) {
      absl::Status error = system_error("mmap", length);
      ::munmap(base, reserved);
      ::close(fd);
      return error;
    }
  }
  // The mappings keep the buffer alive.
  ::close(fd);
  return std::unique_ptr<DiscardRegion>(
      new DiscardRegion(start, reserved, length, buffer));
}

DiscardRegion::~DiscardRegion() {
  if (!quarantined_) ::munmap(base_, reserved_);
}

void DiscardRegion::quarantine() {
  if (quarantined_) return;
  // Should the kernel refuse, the mappings are kept as they are (never
  // unmapped): a late write lands in bytes nobody reads.
  (void)::mmap(base_, reserved_, PROT_NONE,
               MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
  quarantined_ = true;
}

}  // namespace tether::backends::tensorpipe::internal
