#include "common/proto/cluster/cluster_codec.hpp"

#include <utility>

namespace thaw::cluster {
namespace {

template <typename Message>
std::expected<Message, std::string> decoded(Message&& m, std::string error) {
  if (!error.empty()) return std::unexpected(std::move(error));
  return std::move(m);
}

std::expected<void, std::string> checked(std::string error) {
  if (!error.empty()) return std::unexpected(std::move(error));
  return {};
}

}  // namespace

std::expected<v1::NodeMessage, std::string> decode_node_message(std::string_view bytes) {
  v1::NodeMessage m;
  std::string error = core::decode_node_message(bytes, m);
  return decoded(std::move(m), std::move(error));
}

std::expected<v1::CoordinatorMessage, std::string> decode_coordinator_message(
    std::string_view bytes) {
  v1::CoordinatorMessage m;
  std::string error = core::decode_coordinator_message(bytes, m);
  return decoded(std::move(m), std::move(error));
}

std::expected<v1::FrontendRequest, std::string> decode_frontend_request(std::string_view bytes) {
  v1::FrontendRequest m;
  std::string error = core::decode_frontend_request(bytes, m);
  return decoded(std::move(m), std::move(error));
}

std::expected<v1::FrontendReply, std::string> decode_frontend_reply(std::string_view bytes) {
  v1::FrontendReply m;
  std::string error = core::decode_frontend_reply(bytes, m);
  return decoded(std::move(m), std::move(error));
}

std::expected<void, std::string> validate_node_id(std::string_view id) {
  return checked(core::validate_node_id(id));
}

std::expected<void, std::string> validate_model_spec(const v1::ModelSpec& spec) {
  return checked(core::validate_model_spec(spec));
}

std::expected<void, std::string> validate_task(const v1::Task& task) {
  return checked(core::validate_task(task));
}

std::expected<void, std::string> validate_class_rates(const v1::ClassRates& rates) {
  return checked(core::validate_class_rates(rates));
}

}  // namespace thaw::cluster
