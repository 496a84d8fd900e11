// The ZAP handler (ZeroMQ RFC 27) of the coordinator's node endpoint: libzmq asks it, on its
// inproc://zeromq.zap.01 socket, whether each CURVE client key may connect. Keys on the
// NodeAllowList are admitted with User-Id = their node id (every message from that peer then
// carries it); any other key, or any mechanism but CURVE, is refused with 400 and a log line
// with the peer's address.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "coordinator/server/node_allow_list.hpp"

namespace thaw::coordinator {

struct ZapDecision {
  std::string status_code;  // "200" or "400"
  std::string status_text;
  std::string user_id;  // the node id when admitted
};

// The decision alone, for tests: a ZAP request's mechanism and credential frame.
ZapDecision decide_zap(std::string_view mechanism, std::string_view client_key_binary,
                       NodeAllowList& allow);

class ZapHandler {
 public:
  using Logger = std::function<void(int priority, const std::string& line)>;
  // Binds inproc://zeromq.zap.01 in `context` now (before any CURVE socket binds) and serves
  // on its own thread until the context is shut down.
  ZapHandler(zmq::context_t& context, NodeAllowList& allow, Logger log);
  ~ZapHandler();  // the context must be shut down first, so the thread's recv returns
  ZapHandler(const ZapHandler&) = delete;
  ZapHandler& operator=(const ZapHandler&) = delete;

 private:
  void serve();
  zmq::socket_t socket_;
  NodeAllowList& allow_;
  Logger log_;
  std::thread thread_;
};

}  // namespace thaw::coordinator
