#include "backends/common/agent_skeleton.h"

#include <absl/strings/numbers.h>
#include <absl/strings/str_split.h>
#include <absl/strings/strip.h>

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

absl::Status lost_to_silence(const BackendNames& names, absl::string_view self,
                             const WorkerInfo& worker,
                             absl::Duration peer_timeout) {
  return peer_lost(
      worker.name, worker.id,
      absl::StrCat("it left a liveness probe unanswered for ",
                   absl::FormatDuration(peer_timeout),
                   " (the peer timeout) while calls of ", agent_of(names, self),
                   " waited on it"));
}

std::optional<Endpoint> tcp_endpoint(absl::string_view published) {
  for (absl::string_view line :
       absl::StrSplit(published, '\n', absl::SkipEmpty())) {
    if (size_t eq = line.find('='); eq != absl::string_view::npos) {
      absl::string_view transport = line.substr(0, eq);
      if (transport != "tcp" && transport != "uv") continue;
      line.remove_prefix(eq + 1);
    }
    size_t colon = line.rfind(':');
    if (colon == absl::string_view::npos || colon == 0) continue;
    absl::string_view host = line.substr(0, colon);
    int port = 0;
    if (!absl::SimpleAtoi(line.substr(colon + 1), &port) || port <= 0 ||
        port > 65535) {
      continue;
    }
    if (absl::ConsumePrefix(&host, "[") && !absl::ConsumeSuffix(&host, "]")) {
      continue;
    }
    return Endpoint{std::string(host), port};
  }
  return std::nullopt;
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
