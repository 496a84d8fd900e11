#include "test_support.hpp"

#include <stdlib.h>

#include <fstream>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

namespace thaw::store::testing {

namespace fs = std::filesystem;

std::vector<std::byte> make_bytes(std::size_t size, std::uint64_t seed) {
  std::vector<std::byte> out(size);
  std::uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  for (std::size_t i = 0; i < size; i += 8) {
    // splitmix64
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    for (std::size_t b = 0; b < 8 && i + b < size; ++b) {
      out[i + b] = static_cast<std::byte>(z >> (8 * b));
    }
  }
  return out;
}

void write_file(const fs::path& path, const std::vector<std::byte>& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

void write_text(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

bool eventually(const std::function<bool()>& condition, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

void RecordingSink::expect_file(FileId file, std::size_t size) {
  std::lock_guard lock(mutex_);
  data_[file].assign(size, std::byte{0});
  writes_[file].assign(size, 0);
}

std::expected<void, std::string> RecordingSink::write(FileId file, std::uint64_t offset,
                                                      std::span<const std::byte> bytes) {
  std::lock_guard lock(mutex_);
  if (fail_after_ && total_ + bytes.size() > *fail_after_) {
    return std::unexpected(std::string("test sink: disk full"));
  }
  auto it = data_.find(file);
  if (it == data_.end() || offset + bytes.size() > it->second.size()) {
    problems_ += fmt::format("write of {} bytes at {} to file {} out of bounds; ", bytes.size(),
                             offset, file);
    return std::unexpected(std::string("test sink: out of bounds"));
  }
  std::copy(bytes.begin(), bytes.end(), it->second.begin() + static_cast<std::ptrdiff_t>(offset));
  auto& counts = writes_[file];
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    auto& c = counts[offset + i];
    if (c < 255) ++c;
  }
  total_ += bytes.size();
  return {};
}

void RecordingSink::done(FileId file, ByteRange range) {
  std::lock_guard lock(mutex_);
  finished_.push_back(Finished{file, range, std::nullopt});
}

void RecordingSink::failed(FileId file, ByteRange range, const FetchError& error) {
  std::lock_guard lock(mutex_);
  finished_.push_back(Finished{file, range, error});
}

void RecordingSink::fail_after(std::uint64_t bytes) {
  std::lock_guard lock(mutex_);
  fail_after_ = bytes;
}

std::vector<std::byte> RecordingSink::contents(FileId file) const {
  std::lock_guard lock(mutex_);
  return data_.at(file);
}

std::uint64_t RecordingSink::bytes_written_twice(FileId file) const {
  std::lock_guard lock(mutex_);
  std::uint64_t n = 0;
  for (auto c : writes_.at(file)) n += c > 1;
  return n;
}

std::uint64_t RecordingSink::bytes_missing(FileId file) const {
  std::lock_guard lock(mutex_);
  std::uint64_t n = 0;
  for (auto c : writes_.at(file)) n += c == 0;
  return n;
}

std::uint64_t RecordingSink::total_written() const {
  std::lock_guard lock(mutex_);
  return total_;
}

std::vector<RecordingSink::Finished> RecordingSink::finished() const {
  std::lock_guard lock(mutex_);
  return finished_;
}

std::string RecordingSink::problems() const {
  std::lock_guard lock(mutex_);
  return problems_;
}

}  // namespace thaw::store::testing
