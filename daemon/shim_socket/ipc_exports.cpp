#include "daemon/shim_socket/ipc_exports.hpp"

#include <sys/random.h>
#include <sys/stat.h>

#include <fmt/format.h>

namespace thaw::daemon {

namespace {

std::uint64_t random_token() {
  std::uint64_t t = 0;
  while (t == 0) {
    if (::getrandom(&t, sizeof t, 0) != sizeof t) t = 0;
  }
  return t;
}

}  // namespace

ServiceResult<std::uint64_t> IpcExports::add(std::uint64_t connection, UniqueFd fd,
                                             std::uint64_t bytes) {
  std::size_t mine = 0;
  for (const auto& [token, e] : exports_) mine += e.connection == connection;
  if (mine >= kMaxPerConnection) {
    return service_error(error_name::kInvalidArgument,
                         fmt::format("a process may share at most {} allocations over CUDA IPC "
                                     "through thawd at once",
                                     kMaxPerConnection));
  }
  struct stat st {};
  if (bytes == 0 || ::fstat(fd.get(), &st) != 0) {
    return service_error(error_name::kInvalidArgument,
                         "export_ipc needs the allocation's size and its VMM handle's descriptor");
  }
  std::uint64_t token = random_token();
  while (exports_.contains(token)) token = random_token();
  exports_.emplace(token, Entry{connection, std::move(fd), bytes});
  return token;
}

ServiceResult<IpcExports::Export> IpcExports::find(std::uint64_t token) const {
  auto it = exports_.find(token);
  if (it == exports_.end()) {
    return service_error(error_name::kUnknownIpcHandle,
                         "no such CUDA IPC export: the exporting process has exited or freed "
                         "the memory (or the handle is not one thaw made)");
  }
  return Export{it->second.fd.get(), it->second.bytes};
}

std::size_t IpcExports::drop_connection(std::uint64_t connection) {
  return std::erase_if(exports_,
                       [&](const auto& kv) { return kv.second.connection == connection; });
}

}  // namespace thaw::daemon
