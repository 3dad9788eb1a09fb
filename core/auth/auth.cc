#include "core/auth/auth.h"

#include <absl/strings/str_cat.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstdlib>

#include "core/toolkit/check.h"

namespace tether::auth {
namespace {

// Length-prefixed, so that no two argument lists give the same bytes.
void append_field(std::string& out, absl::string_view field) {
  const uint32_t size = static_cast<uint32_t>(field.size());
  out.append(reinterpret_cast<const char*>(&size), sizeof(size));
  out.append(field.data(), field.size());
}

}  // namespace

absl::StatusOr<std::optional<Authenticator>> Authenticator::from(
    const std::string& secret) {
  std::string chosen = secret;
  if (chosen.empty()) {
    const char* env = std::getenv(kSecretEnv);
    if (env != nullptr) chosen = env;
  }
  if (chosen.empty()) return std::optional<Authenticator>();
  if (chosen.size() < 16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the authentication secret (RpcOptions::auth_secret or ", kSecretEnv,
        ") must have at least 16 bytes, got ", chosen.size()));
  }
  return std::optional<Authenticator>(Authenticator(std::move(chosen)));
}

std::string Authenticator::challenge() const {
  std::string out(kChallengeBytes, '\0');
  TETHER_CHECK(RAND_bytes(reinterpret_cast<unsigned char*>(out.data()),
                          static_cast<int>(out.size())) == 1,
               "OpenSSL could not produce random bytes");
  return out;
}

std::string Authenticator::prove(Role role, absl::string_view prover,
                                 absl::string_view verifier,
                                 absl::string_view challenge,
                                 absl::string_view own) const {
  std::string message = "tether-auth-v1";
  append_field(message, role == Role::kClient ? "client" : "server");
  append_field(message, prover);
  append_field(message, verifier);
  append_field(message, challenge);
  append_field(message, own);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  TETHER_CHECK(
      HMAC(EVP_sha256(), secret_.data(), static_cast<int>(secret_.size()),
           reinterpret_cast<const unsigned char*>(message.data()),
           message.size(), mac, &size) != nullptr,
      "OpenSSL HMAC failed");
  return std::string(reinterpret_cast<const char*>(mac), size);
}

bool Authenticator::verify(absl::string_view proof, Role role,
                           absl::string_view prover,
                           absl::string_view verifier,
                           absl::string_view challenge,
                           absl::string_view own) const {
  const std::string expected = prove(role, prover, verifier, challenge, own);
  return proof.size() == expected.size() &&
         CRYPTO_memcmp(proof.data(), expected.data(), expected.size()) == 0;
}

}  // namespace tether::auth
