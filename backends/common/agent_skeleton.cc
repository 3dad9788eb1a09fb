#include "backends/common/agent_skeleton.h"

namespace tether::backends::common {

std::string agent_of(const BackendNames& names, absl::string_view self) {
  return absl::StrCat(names.display, " agent of worker '", self, "'");
}

absl::Status no_shared_transport(const BackendNames& names,
                                 absl::string_view self, absl::string_view to) {
  return absl::UnavailableError(absl::StrCat("worker '", to, "' shares no ",
                                             names.name, " transport with '",
                                             self, "'"));
}

absl::Status publish_addresses(
    const BackendNames& names, c10d::Store& store, const WorkerInfo& self,
    const std::vector<WorkerInfo>& workers, bool dynamic,
    const std::string& mine, absl::Duration timeout, PeerTable& peers,
    const std::function<absl::StatusOr<std::string>(const std::string&)>&
        address_of) {
  const std::string who = agent_of(names, self.name);
  if (dynamic) {
    return publish_and_look_up(store, names.address_key_prefix, self, workers,
                               mine, peers, address_of, who);
  }
  absl::StatusOr<std::vector<std::string>> published =
      exchange_addresses(store, names.address_key_prefix, self.id,
                         static_cast<int>(workers.size()), mine, timeout, who);
  if (!published.ok()) return published.status();
  for (size_t rank = 0; rank < published->size(); ++rank) {
    absl::StatusOr<std::string> address = address_of((*published)[rank]);
    if (!address.ok()) return address.status();
    peers.set_address(static_cast<int>(rank), *std::move(address));
  }
  return absl::OkStatus();
}

}  // namespace tether::backends::common
