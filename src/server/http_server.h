// HttpServer: an event-driven HTTP/1.1 server on Boost.Beast/Asio. A few I/O threads serve every
// connection (one strand each): keep-alive, a request body limit (413), chunked streaming
// responses, and detection of clients that go away mid-response.
//
// Thread-safety: HttpServer's methods are called from one controlling thread. An HttpExchange
// (one request and its response) may be used from any thread: its methods post to the
// connection's strand. Handlers run on an I/O thread and must not block.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>

#include "dinfer/status.h"

namespace dinfer::server {

using HttpRequest = boost::beast::http::request<boost::beast::http::string_body>;
using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

class Connection;
struct ConnectionShared;

// One request's response, written once (Reply) or as a stream (BeginStream, Write..., End).
class HttpExchange {
 public:
  HttpExchange(std::shared_ptr<Connection> connection, uint64_t serial)
      : connection_(std::move(connection)), serial_(serial) {}

  void Reply(unsigned status, std::string content_type, std::string body, HttpHeaders headers = {});
  // A chunked response whose body follows in Write() calls; End() completes it.
  void BeginStream(unsigned status, std::string content_type, HttpHeaders headers = {});
  void Write(std::string data);
  void End();
  // Runs `fn` on the connection's strand, serialised with the exchange's I/O.
  void Post(std::function<void()> fn);
  // `fn` runs once, on the strand, if the client disconnects before the response is complete.
  void OnDisconnect(std::function<void()> fn);

 private:
  std::shared_ptr<Connection> connection_;
  uint64_t serial_;  // which of the connection's requests this is
};

using HttpHandler = std::function<void(HttpRequest request, std::shared_ptr<HttpExchange>)>;
// The response to a request that could not be read (too large, malformed): status and message.
using HttpErrorHandler = std::function<void(const std::string& target, unsigned status,
                                            const std::string& message, HttpExchange&)>;

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;  // 0: any free port (see HttpServer::port())
  int io_threads = 2;
  uint64_t max_body_bytes = 32u << 20;
  int idle_timeout_s = 60;  // keep-alive connections idle this long are closed
};

class HttpServer {
 public:
  HttpServer(HttpServerOptions options, HttpHandler handler, HttpErrorHandler error_handler);
  ~HttpServer();

  // Binds and listens, then starts the I/O threads.
  Status Start();
  uint16_t port() const { return port_; }
  // Stops accepting connections; exchanges in progress continue.
  void StopAccepting();
  // Requests whose response is not complete yet.
  int64_t active_exchanges() const { return active_->load(); }
  // Stops the I/O threads (open connections are dropped) and joins them.
  void Stop();
  boost::asio::io_context& io_context() { return ioc_; }

 private:
  void Accept();

  HttpServerOptions options_;
  std::shared_ptr<const ConnectionShared> shared_;  // what every connection needs
  boost::asio::io_context ioc_;
  boost::asio::ip::tcp::acceptor acceptor_;
  std::shared_ptr<std::atomic<int64_t>> active_;
  std::vector<std::thread> threads_;
  uint16_t port_ = 0;
};

}  // namespace dinfer::server
