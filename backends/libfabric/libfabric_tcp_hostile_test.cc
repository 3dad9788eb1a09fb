// The hostile-peer suite (testing/hostile_peers.h) on tcp;ofi_rxm.
//
// A stranger's first bytes reach libfabric's tcp provider, which reads a
// connection request: a 32-byte control header (version 3, type 0, the
// length of the connection data as a big-endian u16, ...) and then that
// much connection data for ofi_rxm. The openings below announce more
// connection data than ever comes.
#include <cstdint>
#include <string>

#include "backends/libfabric/libfabric_agent.h"
#include "testing/hostile_peers.h"

namespace {

// The tcp provider's connection request header announcing `data_bytes`.
std::string connection_request(uint16_t data_bytes) {
  std::string header(32, '\0');
  header[0] = 3;  // the provider's control header version
  header[1] = 0;  // a connection request
  header[2] = static_cast<char>(data_bytes >> 8);
  header[3] = static_cast<char>(data_bytes & 0xff);
  header[24] = 1;  // conn_data: the sender's byte order
  return header;
}

tether::testing::HostileDialect tcp_provider_dialect() {
  tether::testing::HostileDialect dialect;
  dialect.openings = {
      {"a connection request announcing 65535 bytes of data and sending none",
       connection_request(0xffff)},
      {"a connection request announcing 256 bytes of data and sending 16",
       connection_request(256) + std::string(16, '\x7f')},
  };
  return dialect;
}

}  // namespace

// Strangers are given 1 s (not the default 5 s) to make their connection
// request, to keep the run short.
TETHER_HOSTILE_PEERS_TEST(
    LibfabricTcp,
    tether::backends::libfabric_backend(
        {{"libfabric.provider", "tcp;ofi_rxm"},
         {"libfabric.accept_timeout_ms", "1000"}}),
    tcp_provider_dialect());
