// --api-key-file: the bearer tokens a gateway accepts on its API (/v1/*, /gateway/*).
//
// The file holds one key per line (blank lines and lines starting with '#' are skipped,
// spaces around a key trimmed). It must be a regular file no other user can read or write
// (mode o-rw): the service reads it as a systemd credential (LoadCredential=, mode 0400) or
// from a file of mode 0600/0640. Only SHA-256 digests of the keys are kept, and a presented
// token is compared with every one of them in constant time, so neither a key's bytes nor its
// length can be learnt from response times.
#pragma once

#include <array>
#include <expected>
#include <string>
#include <string_view>
#include <vector>

namespace thaw::gateway {

class ApiKeys {
 public:
  static std::expected<ApiKeys, std::string> load(const std::string& path);
  static ApiKeys from_keys(const std::vector<std::string>& keys);  // tests

  // Whether `authorization` (the header's value) is "Bearer KEY" with a known KEY.
  bool accepts(std::string_view authorization) const;
  std::size_t size() const { return digests_.size(); }

 private:
  using Digest = std::array<unsigned char, 32>;
  static Digest digest(std::string_view text);
  std::vector<Digest> digests_;
};

}  // namespace thaw::gateway
