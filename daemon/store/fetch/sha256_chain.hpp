// Chained SHA-256: one hashing pass that both gates each chunk and checks the whole file.
//
// SHA-256 reads its input in 64-byte blocks through a 256-bit chaining state, starting
// from a fixed IV; the file's digest is the final state after the length padding. When
// the chunk size is a multiple of 64, the state after chunk k depends only on the state
// after chunk k-1 and chunk k's bytes. A manifest that publishes those intermediate
// states (`chunk_chain_sha256`: the state after each chunk but the last) lets a fetcher
// verify any chunk on its own, in any order, on any thread: start from the published
// state before it, hash its bytes, compare with the published state after it — and for
// the last chunk, finish with the padding and compare with the file's sha256 itself.
//
// If every chunk verifies, composing the steps from the IV over the received bytes gives
// exactly the published file sha256, so the whole-file check has been done too, without
// a second pass over the bytes (which on a 2-core node costs as much CPU as the transfer).
// Forging a chunk that maps one published state to the next is a second preimage of the
// SHA-256 compression chain, as hard as for SHA-256 itself.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace thaw::store {

// The SHA-256 block size: a chained chunk size must be a multiple of it.
inline constexpr std::uint64_t kSha256BlockBytes = 64;

// Hashes `bytes`, which lie at `offset` in the file, starting from `state_before_hex`
// (the published state after the previous chunk; empty for the first chunk, meaning the
// IV). Returns the chaining state after them as 64 hex digits, or, when `last` is true,
// the file's final sha256. `offset` must be a multiple of 64; unless `last`, so must
// bytes.size(). nullopt only when `state_before_hex` is not 64 hex digits.
std::optional<std::string> sha256_chain_step(std::string_view state_before_hex,
                                             std::uint64_t offset, std::span<const std::byte> bytes,
                                             bool last);

// Feeds a whole file in order and records the chaining state at every chunk boundary:
// what thaw-fetch publish writes into the manifest.
class Sha256ChainBuilder {
 public:
  explicit Sha256ChainBuilder(std::uint64_t chunk_size);  // a multiple of 64
  ~Sha256ChainBuilder();
  Sha256ChainBuilder(const Sha256ChainBuilder&) = delete;
  Sha256ChainBuilder& operator=(const Sha256ChainBuilder&) = delete;

  void update(std::span<const std::byte> bytes);
  // The state after each chunk except the last (ceil(size / chunk_size) - 1 entries, none
  // for an empty file), and the file's sha256. Call once, after the last update.
  struct Result {
    std::vector<std::string> chain;
    std::string sha256;
  };
  Result finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace thaw::store
