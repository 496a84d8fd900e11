// SHA-256 through OpenSSL's EVP interface (which uses the CPU's SHA extensions where
// present), as lowercase hex — the form thaw-manifest.json and Hugging Face LFS use.
#pragma once

#include <openssl/evp.h>

#include <cstddef>
#include <memory>
#include <span>
#include <string>

namespace thaw::store {

class Sha256 {
 public:
  Sha256();  // throws std::bad_alloc if OpenSSL cannot allocate a context
  Sha256(Sha256&&) noexcept = default;
  Sha256& operator=(Sha256&&) noexcept = default;

  void update(std::span<const std::byte> bytes);
  // The digest of everything updated so far; the object then starts over.
  std::string hex_digest();

 private:
  struct Free {
    void operator()(EVP_MD_CTX* ctx) const { EVP_MD_CTX_free(ctx); }
  };
  std::unique_ptr<EVP_MD_CTX, Free> ctx_;
};

std::string sha256_hex(std::span<const std::byte> bytes);

}  // namespace thaw::store
