// Peer authentication checks every backend passes: workers of
// one process, made with Worker::create over a memory:// rendezvous on the
// backend under test, with and without a shared secret.
//
// The authentication area of the conformance suite
// (testing/auth_conformance.h) runs them on each backend, once per
// variant of its settings.
#ifndef TETHER_TESTING_AUTH_CHECKS_H_
#define TETHER_TESTING_AUTH_CHECKS_H_

#include <string>

#include "absl/container/flat_hash_map.h"

namespace tether::testing {

using BackendSettings = absl::flat_hash_map<std::string, std::string>;

// Two workers with the same secret call each other, with small and 1 MiB
// tensors (and the secret may come from TETHER_AUTH_SECRET instead of the
// options).
void expect_same_secret_works(const std::string& backend,
                              const BackendSettings& settings = {});

// Different secrets: calls either way fail with UNAUTHENTICATED naming the
// peer; each worker still serves a third one that has the right secret.
void expect_wrong_secret_is_refused(const std::string& backend,
                                    const BackendSettings& settings = {});

// One worker without a secret, one with: calls either way fail with
// UNAUTHENTICATED, saying which side lacks the secret.
void expect_missing_secret_is_refused(const std::string& backend,
                                      const BackendSettings& settings = {});

}  // namespace tether::testing

#endif  // TETHER_TESTING_AUTH_CHECKS_H_
