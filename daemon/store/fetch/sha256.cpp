#include "daemon/store/fetch/sha256.hpp"

#include <array>
#include <new>

namespace thaw::store {

namespace {

void start(EVP_MD_CTX* ctx) {
  if (EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr) != 1) throw std::bad_alloc();
}

}  // namespace

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  if (!ctx_) throw std::bad_alloc();
  start(ctx_.get());
}

void Sha256::update(std::span<const std::byte> bytes) {
  EVP_DigestUpdate(ctx_.get(), bytes.data(), bytes.size());
}

std::string Sha256::hex_digest() {
  std::array<unsigned char, EVP_MAX_MD_SIZE> digest{};
  unsigned int length = 0;
  EVP_DigestFinal_ex(ctx_.get(), digest.data(), &length);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * length);
  for (unsigned int i = 0; i < length; ++i) {
    hex.push_back(kHex[digest[i] >> 4]);
    hex.push_back(kHex[digest[i] & 0xf]);
  }
  start(ctx_.get());
  return hex;
}

std::string sha256_hex(std::span<const std::byte> bytes) {
  Sha256 sha;
  sha.update(bytes);
  return sha.hex_digest();
}

}  // namespace thaw::store
