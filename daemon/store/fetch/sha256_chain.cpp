#include "daemon/store/fetch/sha256_chain.hpp"

// The chaining state is only reachable through OpenSSL's low-level SHA256_CTX, which
// OpenSSL 3 marks deprecated in favour of EVP (which hides it). The low-level functions
// run the same SHA-NI/AVX code as EVP.
#define OPENSSL_SUPPRESS_DEPRECATED
#include <openssl/sha.h>

#include <algorithm>
#include <array>

namespace thaw::store {

namespace {

constexpr char kHex[] = "0123456789abcdef";

std::string words_hex(const SHA_LONG (&h)[8]) {
  std::string out;
  out.reserve(64);
  for (SHA_LONG word : h) {
    for (int shift = 28; shift >= 0; shift -= 4) out.push_back(kHex[(word >> shift) & 0xf]);
  }
  return out;
}

std::string bytes_hex(const std::array<unsigned char, SHA256_DIGEST_LENGTH>& digest) {
  std::string out;
  out.reserve(64);
  for (unsigned char b : digest) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 0xf]);
  }
  return out;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Loads a published state (8 big-endian words as hex) into the context's h[].
bool load_state(std::string_view hex, SHA256_CTX& ctx) {
  if (hex.size() != 64) return false;
  for (std::size_t w = 0; w < 8; ++w) {
    SHA_LONG word = 0;
    for (std::size_t i = 0; i < 8; ++i) {
      const int v = hex_value(hex[w * 8 + i]);
      if (v < 0) return false;
      word = (word << 4) | static_cast<SHA_LONG>(v);
    }
    ctx.h[w] = word;
  }
  return true;
}

}  // namespace

std::optional<std::string> sha256_chain_step(std::string_view state_before_hex,
                                             std::uint64_t offset, std::span<const std::byte> bytes,
                                             bool last) {
  SHA256_CTX ctx;
  SHA256_Init(&ctx);
  if (!state_before_hex.empty() && !load_state(state_before_hex, ctx)) return std::nullopt;
  // The length padding at the end counts every bit before this chunk too.
  const std::uint64_t bits = offset * 8;
  ctx.Nl = static_cast<SHA_LONG>(bits & 0xffffffffu);
  ctx.Nh = static_cast<SHA_LONG>(bits >> 32);
  SHA256_Update(&ctx, bytes.data(), bytes.size());
  if (!last) return words_hex(ctx.h);  // ctx.num == 0: whole blocks only
  std::array<unsigned char, SHA256_DIGEST_LENGTH> digest{};
  SHA256_Final(digest.data(), &ctx);
  return bytes_hex(digest);
}

struct Sha256ChainBuilder::Impl {
  SHA256_CTX ctx;
  std::uint64_t chunk_size = 0;
  std::uint64_t in_chunk = 0;
  Result result;
};

Sha256ChainBuilder::Sha256ChainBuilder(std::uint64_t chunk_size) : impl_(std::make_unique<Impl>()) {
  SHA256_Init(&impl_->ctx);
  impl_->chunk_size = chunk_size;
}

Sha256ChainBuilder::~Sha256ChainBuilder() = default;

void Sha256ChainBuilder::update(std::span<const std::byte> bytes) {
  Impl& s = *impl_;
  while (!bytes.empty()) {
    // A boundary reached earlier is recorded only now that more bytes follow it: the
    // state after the last chunk is not published (the file's sha256 stands for it).
    if (s.in_chunk == s.chunk_size) {
      s.result.chain.push_back(words_hex(s.ctx.h));
      s.in_chunk = 0;
    }
    const std::size_t take =
        static_cast<std::size_t>(std::min<std::uint64_t>(bytes.size(), s.chunk_size - s.in_chunk));
    SHA256_Update(&s.ctx, bytes.data(), take);
    s.in_chunk += take;
    bytes = bytes.subspan(take);
  }
}

Sha256ChainBuilder::Result Sha256ChainBuilder::finish() {
  std::array<unsigned char, SHA256_DIGEST_LENGTH> digest{};
  SHA256_Final(digest.data(), &impl_->ctx);
  impl_->result.sha256 = bytes_hex(digest);
  return std::move(impl_->result);
}

}  // namespace thaw::store
