#include "backends/libfabric/internal/fabric_library.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "backends/libfabric/internal/kept_signals.h"
#include "testing/multiprocess.h"
#include "testing/signal_dispositions.h"
#include "testing/status_matchers.h"

namespace tether::backends::libfabric::internal {
namespace {

using ::testing::HasSubstr;
using ::tether::testing::IsOk;
using ::tether::testing::library_mapped;
using ::tether::testing::signal_changes;
using ::tether::testing::signal_dispositions;
using ::tether::testing::StatusIs;

// In a fresh process, where nothing has loaded libfabric: loading it (and
// with it Debian's PSM libraries) leaves every disposition as it was, and
// libinfinipath, told by the environment of the load, installs nothing to
// undo.
TEST(FabricLibrary, LoadingItKeepsEverySignalDisposition) {
  ::tether::testing::run_in_processes(1, [](int, int) {
    ASSERT_FALSE(library_mapped("libfabric.so.1"))
        << "this test binary must not link libfabric";
    ASSERT_EQ(std::getenv("IPATH_NO_BACKTRACE"), nullptr);
    ASSERT_EQ(std::getenv("HFI_BACKTRACE"), nullptr);
    const auto before = signal_dispositions();
    absl::StatusOr<const FabricLibrary*> library = fabric_library();
    ASSERT_THAT(library, IsOk());
    EXPECT_TRUE(library_mapped("libfabric.so.1"));
    EXPECT_EQ(signal_changes(before, signal_dispositions()), "");
    EXPECT_EQ(KeptSignals::last_restored_count(), 0);
    // The environment is the program's again.
    EXPECT_EQ(std::getenv("IPATH_NO_BACKTRACE"), nullptr);
    EXPECT_EQ(loaded_fabric_library(), *library);
    // Once: later calls give the same table.
    EXPECT_EQ(*fabric_library(), *library);
  });
}

// HFI_BACKTRACE set (the program's choice, which the load leaves alone)
// makes libpsm2's constructor install its handlers: they are undone.
TEST(FabricLibrary, HandlersALibraryInstallsWhileLoadingAreUndone) {
  ASSERT_EQ(::setenv("HFI_BACKTRACE", "1", 1), 0);
  ::tether::testing::run_in_processes(1, [](int, int) {
    const auto before = signal_dispositions();
    ASSERT_THAT(fabric_library(), IsOk());
    EXPECT_EQ(signal_changes(before, signal_dispositions()), "");
    if (library_mapped("libpsm2.so")) {
      EXPECT_GT(KeptSignals::last_restored_count(), 0);
    }
    std::printf("with HFI_BACKTRACE set, loading libfabric installed %d "
                "handlers, all undone\n",
                KeptSignals::last_restored_count());
  });
  ::unsetenv("HFI_BACKTRACE");
}

TEST(FabricLibrary, ItsFunctionsWork) {
  absl::StatusOr<const FabricLibrary*> library = fabric_library();
  ASSERT_THAT(library, IsOk());
  fi_info* hints = (*library)->allocinfo();
  ASSERT_NE(hints, nullptr);
  hints->ep_attr->type = FI_EP_RDM;
  fi_info* info = nullptr;
  {
    KeptSignals kept("a test");
    ASSERT_EQ((*library)->getinfo(FI_VERSION(1, 17), nullptr, nullptr, 0,
                                  hints, &info),
              0);
  }
  ASSERT_NE(info, nullptr);
  fi_info* copy = (*library)->dupinfo(info);
  ASSERT_NE(copy, nullptr);
  EXPECT_STREQ(copy->fabric_attr->prov_name, info->fabric_attr->prov_name);
  (*library)->freeinfo(copy);
  (*library)->freeinfo(info);
  (*library)->freeinfo(hints);
  EXPECT_STREQ((*library)->strerror(FI_ENODATA), std::strerror(ENODATA));
}

TEST(FabricLibrary, AMissingLibraryIsAFailedPreconditionNamingIt) {
  EXPECT_THAT(open_fabric_library("libtether-test-no-such-fabric.so.1"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("needs libtether-test-no-such-fabric.so.1, "
                                 "which cannot be loaded")));
}

TEST(FabricLibrary, ALibraryWithoutItsFunctionsIsAFailedPrecondition) {
  EXPECT_THAT(open_fabric_library("libc.so.6"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("it has no fi_getinfo@FABRIC_1.3")));
}

}  // namespace
}  // namespace tether::backends::libfabric::internal
