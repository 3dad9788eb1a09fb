// FabricLibrary: the few functions libfabric exports that the libfabric
// backend calls, from libfabric.so.1 opened at run time (internal to the
// backend; used by fabric.h, and by the raw baseline tools/fabric_pingpong
// through it).
//
// Why at run time: tether links no libfabric (no -lfabric, no DT_NEEDED in
// any tether binary, the Python extension or libtether.so), so a process
// that never chooses the libfabric backend never loads it. Debian's
// libfabric.so.1 needs the PSM providers' libraries, and loading
// libinfinipath.so.4 installs signal handlers in the whole process
// (kept_signals.h); LibTorch's, gRPC's and TensorPipe's libraries install
// none. The library is opened on the first call of fabric_library(): the
// backend's viable() and the agent's creation, never registration.
//
// What it resolves: libfabric's API is mostly static inline functions of
// its headers that call through the ops tables of the objects they take
// (fi_domain, fi_endpoint, fi_cq_read, fi_tsend, fi_read, fi_mr_reg,
// fi_close, ...): those need nothing from here. The exported functions the
// backend uses are fi_getinfo, fi_freeinfo, fi_dupinfo (the inline
// fi_allocinfo is fi_dupinfo(nullptr)), fi_fabric and fi_strerror; code of
// the backend calls them through this table, never by name, so a call by
// name fails to link. Each is resolved at the symbol version that linking
// against libfabric 1.17 records (dlvsym), whose ABI the headers describe:
// a later libfabric keeps those versions beside newer ones.
//
// Signals: while the library loads, the environment holds
// IPATH_NO_BACKTRACE=1 (unless the program set it), so libinfinipath's
// constructor installs no handler at all: the load takes about 0.2 s here
// (libinfinipath's and libpsm2's constructors each time the CPU's clock
// for 0.1 s), and a SIGTERM in that time would otherwise find its handler.
// The variable is added by swapping the `environ` pointer for the load,
// never with setenv(), which is not safe while other threads read the
// environment; after the load the environment is the program's again
// (only a child started during the load would inherit the variable). The load
// also runs inside a KeptSignals scope (kept_signals.h), which undoes what
// any other library's constructor installs (libpsm2's, when the program
// set HFI_BACKTRACE) before fabric_library() returns.
//
// Ownership and thread safety: the library is opened once per process,
// whichever thread asks first, and never closed; the table is immutable
// and lives as long as the process. A failure to open is remembered: every
// later call returns the same error.
#ifndef TETHER_BACKENDS_LIBFABRIC_INTERNAL_FABRIC_LIBRARY_H_
#define TETHER_BACKENDS_LIBFABRIC_INTERNAL_FABRIC_LIBRARY_H_

#include <absl/status/statusor.h>
#include <rdma/fabric.h>
#include <rdma/fi_errno.h>

namespace tether::backends::libfabric::internal {

// The library the backend opens: Debian's libfabric1 package, or any
// libfabric 1.x build of the same ABI.
inline constexpr char kFabricLibraryName[] = "libfabric.so.1";

struct FabricLibrary {
  decltype(&::fi_getinfo) getinfo = nullptr;
  decltype(&::fi_freeinfo) freeinfo = nullptr;
  decltype(&::fi_dupinfo) dupinfo = nullptr;
  decltype(&::fi_fabric) fabric = nullptr;
  decltype(&::fi_strerror) strerror = nullptr;

  // fi_allocinfo(), which the headers define inline over fi_dupinfo.
  fi_info* allocinfo() const { return dupinfo(nullptr); }
};

// libfabric, opened on the first call. FAILED_PRECONDITION naming
// kFabricLibraryName and the loader's reason when it is not installed or
// lacks a function ("the libfabric backend needs libfabric.so.1, which
// cannot be loaded: libfabric.so.1: cannot open shared object file ...").
[[nodiscard]] absl::StatusOr<const FabricLibrary*> fabric_library();

// The table, once fabric_library() has succeeded; nullptr before. For code
// that runs only on objects the library made (error texts of its calls).
const FabricLibrary* loaded_fabric_library();

// Opens `file` as libfabric, each time it is called (tests: a missing
// library, one without the functions). Errors as fabric_library().
[[nodiscard]] absl::StatusOr<FabricLibrary> open_fabric_library(
    const char* file);

}  // namespace tether::backends::libfabric::internal

#endif  // TETHER_BACKENDS_LIBFABRIC_INTERNAL_FABRIC_LIBRARY_H_
