#include "daemon/store/fetch/chunk_set.hpp"

#include <algorithm>

namespace thaw::store {

ChunkSet::ChunkSet(std::uint64_t file_size, std::uint64_t chunk_size)
    : file_size_(file_size),
      chunk_size_(chunk_size == 0 ? 1 : chunk_size),
      chunks_(file_size / chunk_size_ + (file_size % chunk_size_ != 0 ? 1 : 0), false) {}

void ChunkSet::add_bytes(std::uint64_t begin, std::uint64_t end) {
  end = std::min(end, file_size_);
  if (begin >= end) return;
  const std::uint64_t last = (end - 1) / chunk_size_;
  for (std::uint64_t c = begin / chunk_size_; c <= last; ++c) chunks_[c] = true;
}

void ChunkSet::add_all() {
  std::fill(chunks_.begin(), chunks_.end(), true);
}

std::uint64_t ChunkSet::size() const {
  return static_cast<std::uint64_t>(std::count(chunks_.begin(), chunks_.end(), true));
}

std::uint64_t ChunkSet::bytes() const {
  std::uint64_t total = 0;
  for (const ChunkRun& run : runs()) total += byte_range(run).length;
  return total;
}

std::vector<ChunkRun> ChunkSet::runs() const {
  std::vector<ChunkRun> out;
  for (std::uint64_t c = 0; c < chunks_.size(); ++c) {
    if (!chunks_[c]) continue;
    if (!out.empty() && out.back().first + out.back().count == c) {
      ++out.back().count;
    } else {
      out.push_back(ChunkRun{c, 1});
    }
  }
  return out;
}

ByteRange ChunkSet::byte_range(ChunkRun run) const {
  // A chunk index below the count starts inside the file, so these products cannot overflow.
  const std::uint64_t count = chunks_.size();
  const std::uint64_t begin = run.first < count ? run.first * chunk_size_ : file_size_;
  const std::uint64_t end_chunk = run.first + run.count;
  const std::uint64_t end = end_chunk < count ? end_chunk * chunk_size_ : file_size_;
  return ByteRange{begin, end - begin};
}

}  // namespace thaw::store
