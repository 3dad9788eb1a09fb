// Whether the BLAS library LibTorch calls is safe for calls from several
// threads at once.
//
// A worker runs users' functions on a pool of threads, so two matrix
// products can run at the same moment in one process. Debian 12's serial
// OpenBLAS (libopenblas0-serial 0.3.21, the variant installed with
// libtorch-dev unless libopenblas0-pthread is) is not safe for that: eight
// threads doing at::addmm on the same inputs got wrong results in 2 to 4
// of 2,000 products a run, which made the example pipeline
// (examples/pipeline.cc) report a mismatch in about one run of six
// (docs/reliability.md, "Wrong results from concurrent matrix products").
// Its threaded variant (libopenblas0-pthread, which scripts/setup.sh
// installs) locks its buffers and got none wrong.
//
// Thread safety: may be called from any thread.
#ifndef TETHER_CORE_INTERNAL_BLAS_CHECK_H_
#define TETHER_CORE_INTERNAL_BLAS_CHECK_H_

#include <optional>
#include <string>

namespace tether::internal {

// What is wrong with the BLAS library in this process, as a sentence that
// names it and the fix, or nullopt when nothing is known to be: OpenBLAS
// built without threads (openblas_get_parallel() == 0) is named; any other
// library, or none found, is not.
std::optional<std::string> unsafe_blas();

// Logs unsafe_blas()'s sentence as a warning, once per process.
void warn_if_blas_unsafe();

}  // namespace tether::internal

#endif  // TETHER_CORE_INTERNAL_BLAS_CHECK_H_
