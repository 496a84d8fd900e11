#include "coordinator/server/zap_handler.hpp"

#include <fmt/format.h>
#include <syslog.h>
#include <zmq.h>

#include <zmq_addon.hpp>

namespace thaw::coordinator {

ZapDecision decide_zap(std::string_view mechanism, std::string_view client_key_binary,
                       NodeAllowList& allow) {
  if (mechanism != "CURVE") return {"400", "only CURVE is accepted", ""};
  if (client_key_binary.size() != 32) return {"400", "malformed CURVE key", ""};
  char z85[41] = {};
  zmq_z85_encode(z85, reinterpret_cast<const std::uint8_t*>(client_key_binary.data()), 32);
  if (auto node = allow.node_for(z85)) return {"200", "OK", *node};
  return {"400", fmt::format("key {} is not on the allow-list", z85), ""};
}

ZapHandler::ZapHandler(zmq::context_t& context, NodeAllowList& allow, Logger log)
    : socket_(context, zmq::socket_type::rep), allow_(allow), log_(std::move(log)) {
  socket_.set(zmq::sockopt::linger, 0);
  socket_.bind("inproc://zeromq.zap.01");
  thread_ = std::thread([this] { serve(); });
}

ZapHandler::~ZapHandler() {
  if (thread_.joinable()) thread_.join();
}

void ZapHandler::serve() {
  for (;;) {
    std::vector<zmq::message_t> request;
    try {
      if (!zmq::recv_multipart(socket_, std::back_inserter(request))) continue;
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) break;
      continue;
    }
    // version, request id, domain, address, identity, mechanism, credentials...
    if (request.size() < 6) {
      log_(LOG_WARNING, fmt::format("ZAP: a request of {} frames, dropped", request.size()));
      continue;
    }
    const std::string mechanism = request[5].to_string();
    const std::string key = request.size() > 6 ? request[6].to_string() : "";
    ZapDecision d = decide_zap(mechanism, key, allow_);
    if (d.status_code != "200") {
      log_(LOG_WARNING, fmt::format("refused a node connection from {}: {}", request[3].to_string(),
                                    d.status_text));
    }
    std::vector<zmq::const_buffer> reply = {zmq::buffer(std::string_view("1.0")),
                                            zmq::buffer(request[1].data(), request[1].size()),
                                            zmq::buffer(d.status_code),
                                            zmq::buffer(d.status_text),
                                            zmq::buffer(d.user_id),
                                            zmq::buffer(std::string_view())};
    try {
      zmq::send_multipart(socket_, reply);
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) break;
    }
  }
  socket_.close();
}

}  // namespace thaw::coordinator
