// CURVE key pairs for the control plane (ZeroMQ's CurveZMQ), as Z85 text files.
//
// A secret key file holds one line, the 40-character Z85 secret key, and must not be readable
// by group or others (the coordinator and thawd refuse one that is: a leaked node key lets
// anyone act as that node). A public key file holds the 40-character Z85 public key. The
// public key is always derived from the secret one, so a pair cannot be mismatched.
#pragma once

#include <expected>
#include <filesystem>
#include <string>

namespace thaw::zmqx {

struct CurveKeyPair {
  std::string public_z85;  // 40 characters
  std::string secret_z85;
};

// Whether this libzmq was built with CURVE (libsodium); the error says what to install.
std::expected<void, std::string> curve_available();
std::expected<CurveKeyPair, std::string> generate_key_pair();
// Writes PREFIX.key (0600) and PREFIX.pub (0644); refuses to overwrite either.
std::expected<CurveKeyPair, std::string> write_key_pair(const std::filesystem::path& prefix);
std::expected<CurveKeyPair, std::string> load_secret_key(const std::filesystem::path& path);
std::expected<std::string, std::string> load_public_key(const std::filesystem::path& path);
// A 40-character Z85 key, or why not.
std::expected<void, std::string> check_z85_key(const std::string& text);

}  // namespace thaw::zmqx
