// Peer authentication with a shared secret: challenge-response over
// HMAC-SHA256 (OpenSSL's libcrypto). The secret never travels; each side
// proves it knows the secret by answering the other side's fresh random
// challenge, bound to both workers' names and roles, so an answer can be
// neither replayed nor reflected.
//
// Backends run the exchange when a connection is set up (each backend's
// header says how); this file has the cryptography and the secret's source:
// RpcOptions::auth_secret, else the environment variable TETHER_AUTH_SECRET;
// neither set means no authentication.
//
// Thread safety: an Authenticator is immutable; use it from any thread.
#ifndef TETHER_CORE_AUTH_AUTH_H_
#define TETHER_CORE_AUTH_AUTH_H_

#include <absl/status/statusor.h>
#include <absl/strings/string_view.h>

#include <optional>
#include <string>

namespace tether::auth {

inline constexpr char kSecretEnv[] = "TETHER_AUTH_SECRET";
// Challenges are this many random bytes.
inline constexpr size_t kChallengeBytes = 32;

// Which end of a connection is proving itself.
enum class Role { kClient, kServer };

class Authenticator {
 public:
  // `secret` if not empty, else the environment's; nullopt when neither is
  // set. INVALID_ARGUMENT for a secret shorter than 16 bytes.
  [[nodiscard]] static absl::StatusOr<std::optional<Authenticator>> from(
      const std::string& secret);

  // kChallengeBytes fresh random bytes.
  std::string challenge() const;

  // The proof that `prover` (playing `role`) knows the secret, answering
  // `challenge` from `verifier`, bound to its own challenge `own`.
  std::string prove(Role role, absl::string_view prover,
                    absl::string_view verifier, absl::string_view challenge,
                    absl::string_view own) const;

  // Whether `proof` is what prove() gives for these arguments (compared in
  // constant time).
  bool verify(absl::string_view proof, Role role, absl::string_view prover,
              absl::string_view verifier, absl::string_view challenge,
              absl::string_view own) const;

 private:
  explicit Authenticator(std::string secret) : secret_(std::move(secret)) {}

  std::string secret_;
};

}  // namespace tether::auth

#endif  // TETHER_CORE_AUTH_AUTH_H_
