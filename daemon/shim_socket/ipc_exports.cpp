#include "daemon/shim_socket/ipc_exports.hpp"

#include <fmt/format.h>
#include <sys/random.h>
#include <sys/stat.h>

namespace thaw::daemon {

namespace {

std::uint64_t random_token() {
  std::uint64_t t = 0;
  while (t == 0) {
    if (::getrandom(&t, sizeof t, 0) != sizeof t) t = 0;
  }
  return t;
}

// What a descriptor is, for the error message; "" when it can be a VMM export.
std::string_view not_a_vmm_handle(mode_t mode) {
  switch (mode & S_IFMT) {
    case S_IFREG:  // the emulator's memfd
    case S_IFCHR:  // NVIDIA's driver: /dev/nvidia*
      return {};
    case S_IFSOCK:
      return "a socket";
    case S_IFIFO:
      return "a pipe or FIFO";
    case S_IFDIR:
      return "a directory";
    case S_IFBLK:
      return "a block device";
    case S_IFLNK:
      return "a symbolic link";
    default:
      return "an anonymous inode (eventfd, epoll, timerfd...)";
  }
}

}  // namespace

ServiceResult<std::uint64_t> IpcExports::add(std::uint64_t connection, UniqueFd fd,
                                             std::uint64_t bytes) {
  struct stat st {};
  if (bytes == 0 || !fd || ::fstat(fd.get(), &st) != 0) {
    return service_error(error_name::kInvalidArgument,
                         "export_ipc needs the allocation's size and its VMM handle's descriptor");
  }
  if (auto what = not_a_vmm_handle(st.st_mode); !what.empty()) {
    return service_error(error_name::kInvalidArgument,
                         fmt::format("export_ipc: the descriptor is {}, not a VMM handle (what "
                                     "cuMemExportToShareableHandle gives for "
                                     "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)",
                                     what));
  }
  std::size_t& mine = per_connection_[connection];
  if (mine >= kMaxPerConnection) {
    return service_error(error_name::kInvalidArgument,
                         fmt::format("a process may share at most {} allocations over CUDA IPC "
                                     "through thawd at once",
                                     kMaxPerConnection));
  }
  if (exports_.size() >= kMaxTotal) {
    return service_error(error_name::kLimit,
                         fmt::format("thawd already holds {} CUDA IPC exports, its limit; "
                                     "retry once other engines have exited",
                                     kMaxTotal));
  }
  std::uint64_t token = random_token();
  while (exports_.contains(token)) token = random_token();
  exports_.emplace(token, Entry{connection, std::move(fd), bytes});
  ++mine;
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
  per_connection_.erase(connection);
  return std::erase_if(exports_,
                       [&](const auto& kv) { return kv.second.connection == connection; });
}

}  // namespace thaw::daemon
