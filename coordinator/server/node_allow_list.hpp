// The nodes the coordinator admits: a directory of public keys, one file per node named
// "<node-id>.pub" holding that node's 40-character Z85 CURVE public key (thawd writes the
// pair with `thaw-coordinator keygen`; the operator copies the .pub here). A node is who its
// key says: the ZAP handler maps the key to the node id, and every message from it must carry
// that id as its routing id and, in a registration, as node_id.
//
// A key not on the list triggers a rescan when the directory changed since the last one, or
// at most once a second otherwise (a flood of unknown keys costs a stat each), so adding a
// node is copying its key file — no restart.
#pragma once

#include <chrono>
#include <expected>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace thaw::coordinator {

class NodeAllowList {
 public:
  // Fails if the directory cannot be read; warnings (a bad file) are returned by scan().
  static std::expected<NodeAllowList, std::string> open(std::filesystem::path dir);
  NodeAllowList(NodeAllowList&& other) noexcept;

  // The node id a public key (Z85) belongs to.
  std::optional<std::string> node_for(const std::string& public_z85);
  // Re-reads the directory; returns one line per file that was skipped and why.
  std::vector<std::string> scan();
  std::size_t size() const;

 private:
  explicit NodeAllowList(std::filesystem::path dir) : dir_(std::move(dir)) {}
  std::filesystem::path dir_;
  mutable std::mutex mutex_;
  std::map<std::string, std::string> node_by_key_;
  std::chrono::steady_clock::time_point last_scan_{};
  std::filesystem::file_time_type scanned_mtime_{};  // the directory's, at the last scan
};

}  // namespace thaw::coordinator
