// Why a request to thawd failed, in the shape every front end needs: a D-Bus error name
// (org.thaw.Error.*; org.freedesktop.DBus.Error.AccessDenied for refused callers) that
// scripts branch on, and one line saying what was wrong and what to do.
#pragma once

#include <expected>
#include <string>

namespace thaw::daemon {

namespace error_name {
inline constexpr const char* kUnknownModel = "org.thaw.Error.UnknownModel";
inline constexpr const char* kUnknownSlot = "org.thaw.Error.UnknownSlot";
inline constexpr const char* kUnknownGpu = "org.thaw.Error.UnknownGpu";
inline constexpr const char* kInvalidArgument = "org.thaw.Error.InvalidArgument";
inline constexpr const char* kNoRegistry = "org.thaw.Error.NoRegistry";
inline constexpr const char* kRegistry = "org.thaw.Error.Registry";
inline constexpr const char* kCache = "org.thaw.Error.Cache";
inline constexpr const char* kNoGpu = "org.thaw.Error.NoGpu";
inline constexpr const char* kSlotBusy = "org.thaw.Error.SlotBusy";
inline constexpr const char* kNotPrewarmed = "org.thaw.Error.NotPrewarmed";
inline constexpr const char* kGpu = "org.thaw.Error.Gpu";
inline constexpr const char* kNotReady = "org.thaw.Error.NotReady";
inline constexpr const char* kShuttingDown = "org.thaw.Error.ShuttingDown";
inline constexpr const char* kUnknownArtifact = "org.thaw.Error.UnknownArtifact";
inline constexpr const char* kState = "org.thaw.Error.State";  // the state directory failed
inline constexpr const char* kUnknownIpcHandle = "org.thaw.Error.UnknownIpcHandle";
inline constexpr const char* kAccessDenied = "org.freedesktop.DBus.Error.AccessDenied";
// thawd holds as much of something clients can make it hold (connections, IPC exports) as
// it will: retry once others are gone.
inline constexpr const char* kLimit = "org.thaw.Error.Limit";
}  // namespace error_name

struct ServiceError {
  std::string name;  // one of error_name::*
  std::string message;
};

template <typename T>
using ServiceResult = std::expected<T, ServiceError>;

inline std::unexpected<ServiceError> service_error(const char* name, std::string message) {
  return std::unexpected(ServiceError{name, std::move(message)});
}

}  // namespace thaw::daemon
