#include "coordinator/server/node_allow_list.hpp"

#include <fmt/format.h>

#include <set>

#include "common/proto/cluster/cluster_codec.hpp"
#include "common/zmq/curve_keys.hpp"

namespace thaw::coordinator {

std::expected<NodeAllowList, std::string> NodeAllowList::open(std::filesystem::path dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return std::unexpected(fmt::format(
        "{}: not a directory; create it and put each node's <node-id>.pub there", dir.string()));
  }
  return NodeAllowList(std::move(dir));
}

NodeAllowList::NodeAllowList(NodeAllowList&& other) noexcept : dir_(std::move(other.dir_)) {
  std::lock_guard lock(other.mutex_);
  node_by_key_ = std::move(other.node_by_key_);
  last_scan_ = other.last_scan_;
  scanned_mtime_ = other.scanned_mtime_;
}

std::vector<std::string> NodeAllowList::scan() {
  std::vector<std::string> skipped;
  std::map<std::string, std::string> found;
  std::set<std::string> shared;  // keys in more than one file: nobody may use them
  std::error_code ec;
  const auto mtime = std::filesystem::last_write_time(dir_, ec);
  for (const auto& entry : std::filesystem::directory_iterator(dir_, ec)) {
    if (entry.path().extension() != ".pub") continue;
    const std::string node = entry.path().stem().string();
    if (auto ok = cluster::validate_node_id(node); !ok) {
      skipped.push_back(fmt::format("{}: {}", entry.path().string(), ok.error()));
      continue;
    }
    auto key = zmqx::load_public_key(entry.path());
    if (!key) {
      skipped.push_back(key.error());
      continue;
    }
    if (auto [it, fresh] = found.emplace(*key, node); !fresh) {
      skipped.push_back(
          fmt::format("{}: the same key as node {}; neither may use it until one "
                      "is removed",
                      entry.path().string(), it->second));
      shared.insert(*key);
    }
  }
  if (ec) skipped.push_back(fmt::format("{}: {}", dir_.string(), ec.message()));
  std::erase_if(found, [&](const auto& kv) { return shared.contains(kv.first); });
  std::lock_guard lock(mutex_);
  node_by_key_ = std::move(found);
  last_scan_ = std::chrono::steady_clock::now();
  scanned_mtime_ = mtime;
  return skipped;
}

std::optional<std::string> NodeAllowList::node_for(const std::string& public_z85) {
  {
    std::lock_guard lock(mutex_);
    if (auto it = node_by_key_.find(public_z85); it != node_by_key_.end()) return it->second;
    std::error_code ec;
    const bool changed = std::filesystem::last_write_time(dir_, ec) != scanned_mtime_;
    if (!changed && std::chrono::steady_clock::now() - last_scan_ < std::chrono::seconds(1)) {
      return std::nullopt;
    }
  }
  scan();
  std::lock_guard lock(mutex_);
  if (auto it = node_by_key_.find(public_z85); it != node_by_key_.end()) return it->second;
  return std::nullopt;
}

std::size_t NodeAllowList::size() const {
  std::lock_guard lock(mutex_);
  return node_by_key_.size();
}

}  // namespace thaw::coordinator
