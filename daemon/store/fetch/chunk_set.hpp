// A set of a cached file's readiness chunks: which chunks a plan needs, rounded out from
// its byte ranges so that every chunk fetched is whole (and so verifiable against its
// digest), and the runs of consecutive chunks to request.
#pragma once

#include <cstdint>
#include <vector>

#include "common/readiness/chunk_readiness.hpp"
#include "daemon/store/registry/fetch_types.hpp"

namespace thaw::store {

class ChunkSet {
 public:
  // An empty set over a file of `file_size` bytes cut into `chunk_size`-byte chunks.
  ChunkSet(std::uint64_t file_size, std::uint64_t chunk_size);

  std::uint64_t file_size() const { return file_size_; }
  std::uint64_t chunk_size() const { return chunk_size_; }
  std::uint64_t chunk_count() const { return chunks_.size(); }

  // Adds every chunk that holds a byte of [begin, end) (clamped to the file).
  void add_bytes(std::uint64_t begin, std::uint64_t end);
  void add_all();
  void add(std::uint64_t chunk) { chunks_.at(chunk) = true; }
  void remove(std::uint64_t chunk) { chunks_.at(chunk) = false; }
  bool contains(std::uint64_t chunk) const { return chunks_.at(chunk); }

  std::uint64_t size() const;   // chunks in the set
  std::uint64_t bytes() const;  // bytes those chunks hold (the last chunk may be short)
  // Consecutive chunks of the set, in file order.
  std::vector<ChunkRun> runs() const;
  // The bytes of a run of this file's chunks.
  ByteRange byte_range(ChunkRun run) const;

 private:
  std::uint64_t file_size_;
  std::uint64_t chunk_size_;
  std::vector<bool> chunks_;
};

}  // namespace thaw::store
