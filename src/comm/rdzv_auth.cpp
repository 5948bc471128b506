// The rendezvous store's authentication: token proofs by OpenSSL's HMAC-SHA256 (rdzv_auth.h).
#include "comm/rdzv_auth.h"

#include <lockstep/comm/init.h>
#include <lockstep/env_contract.h>
#include <lockstep/error.h>

#include "comm/rendezvous.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

namespace lockstep::comm {
namespace {

namespace key {
const char* const kJob = "lockstep/rdzv/job";      // rank 0's job id
const char* const kAuth = "lockstep/rdzv/auth";    // "token" or "none"
const char* const kNonce = "lockstep/rdzv/nonce";  // fresh per store: proofs cannot be replayed
const char* const kCheck = "lockstep/rdzv/check";  // rank 0's proof: tells a wrong token
}  // namespace key

std::string to_hex(const unsigned char* raw, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    out.push_back(digits[raw[i] >> 4]);
    out.push_back(digits[raw[i] & 15]);
  }
  return out;
}

// `bytes` bytes from OpenSSL's CSPRNG (seeded by the kernel), as hex digits.
std::string random_hex(size_t bytes) {
  std::string raw(bytes, '\0');
  auto* p = reinterpret_cast<unsigned char*>(raw.data());
  if (RAND_bytes(p, static_cast<int>(bytes)) != 1)
    throw ConfigError("rendezvous: OpenSSL's RAND_bytes found no entropy for the store's nonce");
  return to_hex(p, bytes);
}

std::string show_id(const std::string& id) { return id.empty() ? "(none)" : "'" + id + "'"; }

[[noreturn]] void refuse(const LaunchEnv& e, const std::string& why) {
  throw ConfigError(lockstep::detail::concat("rank ", e.rank,
                                             " refused by the rendezvous store at ", e.master_addr,
                                             ":", e.master_port, ": ", why));
}

void publish_as_rank0(const StorePtr& store, const LaunchEnv& e) {
  const std::string nonce = random_hex(16);
  store_set(store, key::kNonce, nonce);
  store_set(store, key::kAuth, e.rdzv_token.empty() ? "none" : "token");
  if (!e.rdzv_token.empty())
    store_set(store, key::kCheck, rdzv_proof(e.rdzv_token, nonce + "\ncheck"));
  store_set(store, key::kJob, e.job_id);  // last: the others wait for it
}

}  // namespace

std::string rdzv_proof(const std::string& token, const std::string& message) {
  // HMAC-SHA256 (RFC 2104, FIPS 198-1): a key longer than SHA-256's 64-byte block is
  // hashed first, a shorter one zero-padded, as the RFC 4231 vectors of its test check.
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()),
           reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac,
           &len) == nullptr)
    throw ConfigError("rendezvous: OpenSSL's HMAC-SHA256 failed (libcrypto without SHA-256?)");
  return to_hex(mac, len);
}

void handshake(const StorePtr& store, const LaunchEnv& e) {
  namespace n = lockstep::env;
  if (e.rank == 0) return publish_as_rank0(store, e);
  const std::string job = store_get(store, key::kJob);
  if (job != e.job_id)
    refuse(e, lockstep::detail::concat(
                  "it belongs to job ", show_id(job), ", this rank to job ", show_id(e.job_id),
                  ". Two jobs share the port: give each its own --master-port "
                  "(MASTER_PORT), or every node of one job the same --rdzv-id (",
                  n::kJobId, ")"));
  const bool required = store_get(store, key::kAuth) == "token";
  if (required && e.rdzv_token.empty())
    refuse(e,
           lockstep::detail::concat("rank 0 requires the job's token and this rank has none; set ",
                                    n::kRdzvToken, " or ", n::kRdzvTokenFile, " on every node"));
  if (!required && !e.rdzv_token.empty())
    refuse(e, lockstep::detail::concat("this rank has a token but rank 0 has none; set the same ",
                                       n::kRdzvToken, " or ", n::kRdzvTokenFile, " on every node"));
  if (required && store_get(store, key::kCheck) !=
                      rdzv_proof(e.rdzv_token, store_get(store, key::kNonce) + "\ncheck"))
    refuse(e, lockstep::detail::concat("this rank's token differs from rank 0's; set the same ",
                                       n::kRdzvToken, " or ", n::kRdzvTokenFile, " on every node"));
}

std::string seal(const StorePtr& store, const LaunchEnv& e, const std::string& k,
                 const std::string& payload) {
  if (e.rdzv_token.empty() || e.world_size == 1) return payload;
  const std::string msg =
      store_get(store, key::kNonce) + "\n" + e.job_id + "\n" + k + "\n" + payload;
  return payload + "\n" + rdzv_proof(e.rdzv_token, msg);
}

std::string unseal(const StorePtr& store, const LaunchEnv& e, const std::string& k,
                   const std::string& entry, int rank) {
  if (e.rdzv_token.empty() || e.world_size == 1) return entry;
  const auto cut = entry.rfind('\n');
  std::string payload = cut == std::string::npos ? entry : entry.substr(0, cut);
  if (cut == std::string::npos || seal(store, e, k, payload) != entry) {
    CommContext c;
    c.rank = e.rank;
    c.world_size = e.world_size;
    c.op = "rendezvous";
    c.peer = rank;
    throw CommError(
        CommError::Kind::Rendezvous, c,
        lockstep::detail::concat("the join entry of rank ", rank,
                                 " carries no valid proof of the job's token: a process "
                                 "without the token wrote it; the job stops rather than "
                                 "accept it"));
  }
  return payload;
}

}  // namespace lockstep::comm
