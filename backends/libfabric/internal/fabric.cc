#include "backends/libfabric/internal/fabric.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_errno.h>

#include <dirent.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>
#include <set>

#include "backends/libfabric/internal/fabric_library.h"
#include "backends/libfabric/internal/kept_signals.h"

namespace tether::backends::libfabric::internal {
namespace {

constexpr uint32_t kApiVersion = FI_VERSION(1, 17);

// Frees an fi_info list when it goes out of scope.
struct InfoDeleter {
  const FabricLibrary* library = nullptr;
  void operator()(fi_info* info) const {
    if (info != nullptr) library->freeinfo(info);
  }
};
using InfoPtr = std::unique_ptr<fi_info, InfoDeleter>;

// What tether needs of any provider: reliable datagram endpoints with tagged
// messages; RMA reads when asked. What it copes with: the contexts and
// memory-registration modes below.
InfoPtr make_hints(const FabricLibrary& library, const std::string& provider,
                   bool rma) {
  InfoPtr hints(library.allocinfo(), InfoDeleter{&library});
  hints->ep_attr->type = FI_EP_RDM;
  hints->caps = FI_TAGGED;
  if (rma) hints->caps |= FI_RMA | FI_READ | FI_REMOTE_READ;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->domain_attr->mr_mode =
      FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
  hints->domain_attr->threading = FI_THREAD_DOMAIN;
  if (!provider.empty()) {
    hints->fabric_attr->prov_name = ::strdup(provider.c_str());
  }
  return hints;
}

bool addressed_by_ip(uint32_t format) {
  return format == FI_SOCKADDR || format == FI_SOCKADDR_IN ||
         format == FI_SOCKADDR_IN6;
}

// fi_getinfo for `provider`, bound to `address` when it is not empty. The
// first call in a process initialises libfabric's providers: callers keep
// signal dispositions around it (KeptSignals).
int get_info(const FabricLibrary& library, const std::string& provider,
             bool rma, const std::string& address, InfoPtr* out) {
  InfoPtr hints = make_hints(library, provider, rma);
  const char* node = address.empty() ? nullptr : address.c_str();
  const uint64_t flags = address.empty() ? 0 : FI_SOURCE;
  fi_info* info = nullptr;
  const int rc = library.getinfo(kApiVersion, node, nullptr, flags,
                                 hints.get(), &info);
  *out = InfoPtr(rc == 0 ? info : nullptr, InfoDeleter{&library});
  if (rc != 0 && info != nullptr) library.freeinfo(info);
  return rc;
}

std::vector<std::string> rdm_providers(const FabricLibrary& library) {
  InfoPtr info;
  if (get_info(library, "", /*rma=*/false, "", &info) != 0) return {};
  std::set<std::string> names;
  for (const fi_info* entry = info.get(); entry != nullptr;
       entry = entry->next) {
    names.insert(entry->fabric_attr->prov_name);
  }
  return {names.begin(), names.end()};
}

absl::Status not_available(const FabricLibrary& library,
                           const std::string& provider, int rc) {
  const std::vector<std::string> available = rdm_providers(library);
  return absl::FailedPreconditionError(absl::StrCat(
      "libfabric provider '", provider,
      "' is not available on this machine (fi_getinfo: ", fi_error_text(-rc),
      "); RDM providers here: ",
      available.empty() ? "none" : absl::StrJoin(available, ", ")));
}

// shm names its memory region (a file in /dev/shm) after the endpoint's
// source address, by default "<pid>:<domain>:<endpoint>". A process killed
// with SIGKILL leaves its file behind, and a later process that gets the
// same pid cannot create its own (EBUSY). So tether's shm endpoints are
// named "tether-lf-<pid namespace>-<pid>-<random>", and opening one removes
// the files of such endpoints whose process, in this pid namespace, is gone.
constexpr char kShmNamePrefix[] = "tether-lf-";

std::string pid_namespace() {
  char link[64] = {0};
  const ssize_t length = ::readlink("/proc/self/ns/pid", link, sizeof(link));
  std::string digits;
  for (ssize_t i = 0; i < length; ++i) {
    if (link[i] >= '0' && link[i] <= '9') digits += link[i];
  }
  return digits.empty() ? "0" : digits;
}

void remove_stale_shm_regions(const std::string& prefix) {
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (name.rfind(prefix, 0) != 0) continue;
    const long pid = std::strtol(name.c_str() + prefix.size(), nullptr, 10);
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
      ::shm_unlink(name.c_str());
    }
  }
  ::closedir(dir);
}

// Names an shm endpoint's region (see kShmNamePrefix) in `info`.
void name_shm_endpoint(fi_info* info) {
  const std::string prefix =
      absl::StrCat(kShmNamePrefix, pid_namespace(), "-");
  remove_stale_shm_regions(prefix);
  std::random_device random;
  const std::string name =
      absl::StrCat("fi_shm://", prefix, ::getpid(), "-",
                   absl::Hex(static_cast<uint64_t>(random()) << 32 | random()));
  std::free(info->src_addr);
  info->src_addr = ::strdup(name.c_str());
  info->src_addrlen = name.size() + 1;
}

absl::Status call_failed(absl::string_view call, int rc) {
  return absl::UnavailableError(
      absl::StrCat("libfabric ", call, " failed: ", fi_error_text(-rc)));
}

}  // namespace

std::string fi_error_text(int error) {
  // Errors come from calls into the library, so it is loaded; the C
  // library's text is a fallback that never crashes.
  const FabricLibrary* library = loaded_fabric_library();
  return absl::StrCat(
      library != nullptr ? library->strerror(error) : std::strerror(error),
      " (", error, ")");
}

std::vector<std::string> rdm_providers() {
  absl::StatusOr<const FabricLibrary*> library = fabric_library();
  if (!library.ok()) return {};
  KeptSignals kept("libfabric fi_getinfo");
  return rdm_providers(**library);
}

absl::Status probe(const std::string& provider) {
  absl::StatusOr<const FabricLibrary*> library = fabric_library();
  if (!library.ok()) return library.status();
  KeptSignals kept("libfabric fi_getinfo");
  InfoPtr info;
  const int rc = get_info(**library, provider, /*rma=*/false, "", &info);
  if (rc != 0) return not_available(**library, provider, rc);
  return absl::OkStatus();
}

// ---------------------------------------------------------- MemoryRegion

MemoryRegion::MemoryRegion(fid_mr* mr, const char* base, size_t length,
                           bool virt_addr)
    : mr_(mr), base_(base), length_(length), virt_addr_(virt_addr) {}

MemoryRegion::~MemoryRegion() { fi_close(&mr_->fid); }

void* MemoryRegion::desc() const { return fi_mr_desc(mr_); }

uint64_t MemoryRegion::key() const { return fi_mr_key(mr_); }

uint64_t MemoryRegion::remote_address(const void* p) const {
  const char* at = static_cast<const char*>(p);
  return virt_addr_ ? reinterpret_cast<uint64_t>(at)
                    : static_cast<uint64_t>(at - base_);
}

// ---------------------------------------------------------------- Fabric

absl::StatusOr<std::unique_ptr<Fabric>> Fabric::open(
    const FabricOptions& options, size_t av_count) {
  absl::StatusOr<const FabricLibrary*> loaded = fabric_library();
  if (!loaded.ok()) return loaded.status();
  const FabricLibrary& library = **loaded;
  // Providers set themselves up here (shm installs signal handlers at its
  // first endpoint): everything they install is undone on return.
  KeptSignals kept("opening a libfabric endpoint");
  InfoPtr info;
  bool rma = options.want_rma;
  int rc = get_info(library, options.provider, rma, "", &info);
  if (rc == -FI_ENODATA && rma) {
    rma = false;
    rc = get_info(library, options.provider, rma, "", &info);
  }
  if (rc != 0) return not_available(library, options.provider, rc);
  if (!options.address.empty() && addressed_by_ip(info->addr_format)) {
    InfoPtr bound;
    rc = get_info(library, options.provider, rma, options.address, &bound);
    if (rc == 0) {
      info = std::move(bound);
    } else if (options.address_required) {
      return absl::InvalidArgumentError(absl::StrCat(
          "libfabric provider '", options.provider,
          "' cannot use the address '", options.address,
          "' (fi_getinfo: ", fi_error_text(-rc),
          "); set libfabric.address to an IP address or network interface "
          "of this machine"));
    }
  }

  if (info->addr_format == FI_ADDR_STR &&
      std::string(info->fabric_attr->prov_name) == "shm") {
    name_shm_endpoint(info.get());
  }

  std::unique_ptr<Fabric> fabric(new Fabric(library));
  fabric->info_ = info.release();
  fi_info* chosen = fabric->info_;
  rc = library.fabric(chosen->fabric_attr, &fabric->fabric_, nullptr);
  if (rc != 0) return call_failed("fi_fabric", rc);
  rc = fi_domain(fabric->fabric_, chosen, &fabric->domain_, nullptr);
  if (rc != 0) return call_failed("fi_domain", rc);

  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_TAGGED;
  cq_attr.size = fabric->tx_size() + fabric->rx_size();
  cq_attr.wait_obj = FI_WAIT_FD;
  rc = fi_cq_open(fabric->domain_, &cq_attr, &fabric->cq_, nullptr);
  if (rc == 0 &&
      fi_control(&fabric->cq_->fid, FI_GETWAIT, &fabric->wait_fd_) != 0) {
    fi_close(&fabric->cq_->fid);
    fabric->cq_ = nullptr;
    fabric->wait_fd_ = -1;
    rc = -FI_ENOSYS;
  }
  if (rc != 0) {
    // No file descriptor to sleep on (shm): the progress thread polls.
    fabric->wait_fd_ = -1;
    cq_attr.wait_obj = FI_WAIT_NONE;
    rc = fi_cq_open(fabric->domain_, &cq_attr, &fabric->cq_, nullptr);
    if (rc != 0) return call_failed("fi_cq_open", rc);
  }

  fi_av_attr av_attr{};
  av_attr.type = FI_AV_TABLE;
  av_attr.count = av_count;
  rc = fi_av_open(fabric->domain_, &av_attr, &fabric->av_, nullptr);
  if (rc != 0) return call_failed("fi_av_open", rc);

  rc = fi_endpoint(fabric->domain_, chosen, &fabric->ep_, nullptr);
  if (rc != 0) return call_failed("fi_endpoint", rc);
  rc = fi_ep_bind(fabric->ep_, &fabric->av_->fid, 0);
  if (rc != 0) return call_failed("fi_ep_bind (address vector)", rc);
  rc = fi_ep_bind(fabric->ep_, &fabric->cq_->fid, FI_TRANSMIT | FI_RECV);
  if (rc != 0) return call_failed("fi_ep_bind (completion queue)", rc);
  rc = fi_enable(fabric->ep_);
  if (rc != 0) return call_failed("fi_enable", rc);
  return fabric;
}

Fabric::~Fabric() {
  close_endpoint();
  if (av_ != nullptr) fi_close(&av_->fid);
  if (cq_ != nullptr) fi_close(&cq_->fid);
  if (domain_ != nullptr) fi_close(&domain_->fid);
  if (fabric_ != nullptr) fi_close(&fabric_->fid);
  if (info_ != nullptr) library_.freeinfo(info_);
}

void Fabric::close_endpoint() {
  if (ep_ != nullptr) fi_close(&ep_->fid);
  ep_ = nullptr;
}

std::string Fabric::provider_name() const {
  return info_->fabric_attr->prov_name;
}

bool Fabric::has_rma() const {
  return (info_->caps & FI_RMA) != 0 && (info_->caps & FI_READ) != 0;
}

size_t Fabric::tx_size() const { return info_->tx_attr->size; }

size_t Fabric::rx_size() const { return info_->rx_attr->size; }

size_t Fabric::inject_size() const { return info_->tx_attr->inject_size; }

uint64_t Fabric::max_message_size() const {
  return info_->ep_attr->max_msg_size;
}

absl::StatusOr<std::string> Fabric::name() const {
  std::string name(256, '\0');
  size_t length = name.size();
  int rc = fi_getname(&ep_->fid, name.data(), &length);
  if (rc == -FI_ETOOSMALL) {
    name.resize(length);
    rc = fi_getname(&ep_->fid, name.data(), &length);
  }
  if (rc != 0) return call_failed("fi_getname", rc);
  name.resize(length);
  return name;
}

absl::StatusOr<std::vector<fi_addr_t>> Fabric::insert(
    const std::vector<std::string>& names) {
  std::vector<fi_addr_t> addresses;
  addresses.reserve(names.size());
  for (const std::string& name : names) {
    fi_addr_t address = FI_ADDR_NOTAVAIL;
    const int rc = fi_av_insert(av_, name.data(), 1, &address, 0, nullptr);
    if (rc != 1 || address == FI_ADDR_NOTAVAIL) {
      return absl::InvalidArgumentError(absl::StrCat(
          "libfabric fi_av_insert refused address number ", addresses.size(),
          " (", name.size(), " bytes): ",
          rc < 0 ? fi_error_text(-rc) : "not inserted"));
    }
    addresses.push_back(address);
  }
  return addresses;
}

absl::Status Fabric::remove(fi_addr_t address) {
  if (address == FI_ADDR_NOTAVAIL) return absl::OkStatus();
  const int rc = fi_av_remove(av_, &address, 1, 0);
  if (rc != 0) return call_failed("fi_av_remove", rc);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<MemoryRegion>> Fabric::register_memory(
    const void* p, size_t length, uint64_t access) {
  const uint64_t mr_mode = info_->domain_attr->mr_mode;
  const uint64_t requested_key = (mr_mode & FI_MR_PROV_KEY) ? 0 : next_key_++;
  fid_mr* mr = nullptr;
  const int rc = fi_mr_reg(domain_, p, length, access, 0, requested_key, 0,
                           &mr, nullptr);
  if (rc != 0) {
    return absl::UnavailableError(absl::StrCat(
        "libfabric fi_mr_reg of ", length, " bytes failed: ",
        fi_error_text(-rc)));
  }
  return std::make_unique<MemoryRegion>(mr, static_cast<const char*>(p), length,
                                        (mr_mode & FI_MR_VIRT_ADDR) != 0);
}

}  // namespace tether::backends::libfabric::internal
