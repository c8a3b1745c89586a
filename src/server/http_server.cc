// HTTP/1.1 connections: Beast parses requests; responses are framed here (Content-Length or
// chunked) so that full and streamed responses share one write queue. While a request is being
// handled the connection keeps a read pending: it sees a client that goes away (and keeps any
// pipelined bytes for the next request).
#include "server/http_server.h"

#include <deque>
#include <optional>

#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/status.hpp>

#include "base/logging.h"

namespace dinfer::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

struct ConnectionShared {
  HttpServerOptions options;
  HttpHandler handler;
  HttpErrorHandler error_handler;
  std::shared_ptr<std::atomic<int64_t>> active;
};

namespace {

constexpr size_t kHeaderLimit = 64 << 10;
// Bytes a client may pipeline behind a request that is still being answered.
constexpr size_t kPipelineLimit = 64 << 10;

std::string Head(unsigned status, const std::string& content_type, const HttpHeaders& headers,
                 bool keep_alive) {
  std::string h = fmt::format("HTTP/1.1 {} {}\r\n", status,
                              std::string_view(http::obsolete_reason(http::int_to_status(status))));
  if (!content_type.empty()) h += fmt::format("Content-Type: {}\r\n", content_type);
  for (const auto& [name, value] : headers) h += fmt::format("{}: {}\r\n", name, value);
  if (!keep_alive) h += "Connection: close\r\n";
  return h;
}

}  // namespace

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(tcp::socket&& socket, std::shared_ptr<const ConnectionShared> shared)
      : stream_(std::move(socket)), shared_(std::move(shared)) {}

  void Start() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->DoRead(); });
  }

  // The exchange API, each call posted to the strand and dropped unless `serial` is the
  // exchange in progress.
  void Reply(uint64_t serial, unsigned status, std::string content_type, std::string body,
             HttpHeaders headers) {
    Run([=, this, body = std::move(body)]() mutable {
      if (!Current(serial) || response_started_) return;
      response_started_ = true;
      std::string out = Head(status, content_type, headers, keep_alive_);
      out += fmt::format("Content-Length: {}\r\n\r\n", body.size());
      out += body;
      Queue(std::move(out), true);
    });
  }
  void BeginStream(uint64_t serial, unsigned status, std::string content_type,
                   HttpHeaders headers) {
    Run([=, this] {
      if (!Current(serial) || response_started_) return;
      response_started_ = streaming_ = true;
      // HTTP/1.0 has no chunked encoding: the body ends when the connection closes.
      if (http10_) keep_alive_ = false;
      std::string out = Head(status, content_type, headers, keep_alive_);
      out += http10_ ? "Cache-Control: no-cache\r\n\r\n"
                     : "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n";
      Queue(std::move(out), false);
    });
  }
  void Write(uint64_t serial, std::string data) {
    if (data.empty()) return;
    Run([=, this, data = std::move(data)] {
      if (!Current(serial) || !streaming_ || last_queued_) return;
      Queue(http10_ ? data : fmt::format("{:x}\r\n{}\r\n", data.size(), data), false);
    });
  }
  void End(uint64_t serial) {
    Run([=, this] {
      if (!Current(serial) || !streaming_ || last_queued_) return;
      Queue(http10_ ? "" : "0\r\n\r\n", true);
    });
  }
  void Post(std::function<void()> fn) { net::post(stream_.get_executor(), std::move(fn)); }
  void OnDisconnect(uint64_t serial, std::function<void()> fn) {
    Run([=, this, fn = std::move(fn)]() mutable {
      if (Current(serial)) {
        on_disconnect_ = std::move(fn);
      } else if (serial == serial_ && closed_) {
        fn();  // the client left before the handler asked
      }
    });
  }

 private:
  template <typename Fn>
  void Run(Fn&& fn) {
    net::post(stream_.get_executor(),
              [self = shared_from_this(), fn = std::forward<Fn>(fn)]() mutable { fn(); });
  }
  bool Current(uint64_t serial) const { return serial == serial_ && exchange_open_ && !closed_; }

  void DoRead() {
    if (closed_) return;
    parser_.emplace();
    // The body limit is applied once the header is read, so that the 413 knows the target.
    parser_->body_limit(boost::none);
    parser_->header_limit(kHeaderLimit);
    stream_.expires_after(std::chrono::seconds(shared_->options.idle_timeout_s));
    http::async_read_header(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->OnHeader(ec); });
  }

  void OnHeader(beast::error_code ec) {
    if (ec) return ReadFailed(ec);
    const auto& req = parser_->get();
    const uint64_t limit = shared_->options.max_body_bytes;
    if (parser_->content_length().value_or(0) > limit) return ReadFailed(http::error::body_limit);
    parser_->body_limit(limit);
    if (beast::iequals(req[http::field::expect], "100-continue")) {
      // curl waits for this before sending a body larger than 1 KiB.
      auto msg = std::make_shared<std::string>("HTTP/1.1 100 Continue\r\n\r\n");
      net::async_write(stream_, net::buffer(*msg),
                       [self = shared_from_this(), msg](beast::error_code ec, size_t) {
                         if (ec) return self->Close();
                         self->ReadBody();
                       });
      return;
    }
    ReadBody();
  }

  void ReadBody() {
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       if (ec) return self->ReadFailed(ec);
                       self->Handle();
                     });
  }

  void ReadFailed(beast::error_code ec) {
    unsigned status = 0;
    std::string message;
    if (ec == http::error::body_limit) {
      status = 413;
      message = fmt::format("the request body exceeds the server's limit of {} bytes",
                            shared_->options.max_body_bytes);
    } else if (ec == http::error::header_limit) {
      status = 431;
      message = "the request headers are too large";
    } else if (ec.category() == http::make_error_code(http::error::end_of_stream).category() &&
               ec != http::error::end_of_stream && ec != http::error::partial_message) {
      status = 400;
      message = fmt::format("malformed HTTP request: {}", ec.message());
    }
    if (status == 0) return Close();  // end of stream, timeout, reset
    // The request cannot be read further: answer it and close the connection.
    std::string target = parser_->is_header_done() ? std::string(parser_->get().target()) : "";
    keep_alive_ = false;
    auto exchange = OpenExchange();
    shared_->error_handler(target, status, message, *exchange);
  }

  std::shared_ptr<HttpExchange> OpenExchange() {
    ++serial_;
    exchange_open_ = true;
    response_started_ = streaming_ = last_queued_ = false;
    shared_->active->fetch_add(1);
    return std::make_shared<HttpExchange>(shared_from_this(), serial_);
  }

  void Handle() {
    HttpRequest req = parser_->release();
    keep_alive_ = req.keep_alive();
    http10_ = req.version() == 10;
    stream_.expires_never();
    auto exchange = OpenExchange();
    Watch();
    shared_->handler(std::move(req), std::move(exchange));
  }

  void Watch() {
    watching_ = true;
    stream_.async_read_some(
        buffer_.prepare(4096),
        [self = shared_from_this()](beast::error_code ec, size_t n) { self->OnWatch(ec, n); });
  }

  void OnWatch(beast::error_code ec, size_t n) {
    watching_ = false;
    if (n > 0) buffer_.commit(n);
    if (read_after_watch_) {
      read_after_watch_ = false;
      if (!ec || ec == net::error::operation_aborted) return DoRead();
      return Close();
    }
    if (closed_) return;
    if (ec) return Disconnected();
    if (buffer_.size() < kPipelineLimit) Watch();
  }

  void Queue(std::string data, bool last) {
    out_ += data;
    if (last) last_queued_ = true;
    if (out_.empty() && !writing_ && last_queued_) return CompleteExchange();
    DoWrite();
  }

  void DoWrite() {
    if (writing_ || out_.empty() || closed_) return;
    writing_ = true;
    writing_buf_.swap(out_);
    out_.clear();
    net::async_write(stream_, net::buffer(writing_buf_),
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       self->writing_ = false;
                       self->writing_buf_.clear();
                       if (ec) return self->Disconnected();
                       if (!self->out_.empty()) return self->DoWrite();
                       if (self->last_queued_ && self->exchange_open_) self->CompleteExchange();
                     });
  }

  void CompleteExchange() {
    exchange_open_ = false;
    on_disconnect_ = nullptr;
    shared_->active->fetch_sub(1);
    if (!keep_alive_) return LingeringClose();
    if (watching_) {
      read_after_watch_ = true;
      beast::error_code ec;
      stream_.socket().cancel(ec);
    } else {
      DoRead();
    }
  }

  // After an error response the client may still be sending the body it announced: read and
  // drop it for a while so that closing does not reset the connection before the client has
  // read the response.
  void LingeringClose() {
    closed_ = true;
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream_.expires_after(std::chrono::seconds(5));
    Drain();
  }
  void Drain() {
    buffer_.clear();
    stream_.async_read_some(buffer_.prepare(64 << 10),
                            [self = shared_from_this()](beast::error_code ec, size_t) {
                              if (ec) {
                                beast::error_code ignored;
                                self->stream_.socket().close(ignored);
                                return;
                              }
                              self->Drain();
                            });
  }

  void Disconnected() {
    if (closed_) return;
    if (exchange_open_) {
      exchange_open_ = false;
      shared_->active->fetch_sub(1);
      if (auto fn = std::move(on_disconnect_)) fn();
    }
    Close();
  }

  void Close() {
    closed_ = true;
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.socket().close(ec);
  }

  beast::tcp_stream stream_;
  std::shared_ptr<const ConnectionShared> shared_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::string out_, writing_buf_;
  std::function<void()> on_disconnect_;
  uint64_t serial_ = 0;
  bool exchange_open_ = false, response_started_ = false, streaming_ = false;
  bool last_queued_ = false, keep_alive_ = true, http10_ = false, writing_ = false;
  bool watching_ = false, read_after_watch_ = false, closed_ = false;

  friend class HttpExchange;
};

void HttpExchange::Reply(unsigned status, std::string content_type, std::string body,
                         HttpHeaders headers) {
  connection_->Reply(serial_, status, std::move(content_type), std::move(body), std::move(headers));
}
void HttpExchange::BeginStream(unsigned status, std::string content_type, HttpHeaders headers) {
  connection_->BeginStream(serial_, status, std::move(content_type), std::move(headers));
}
void HttpExchange::Write(std::string data) { connection_->Write(serial_, std::move(data)); }
void HttpExchange::End() { connection_->End(serial_); }
void HttpExchange::Post(std::function<void()> fn) { connection_->Post(std::move(fn)); }
void HttpExchange::OnDisconnect(std::function<void()> fn) {
  connection_->OnDisconnect(serial_, std::move(fn));
}

HttpServer::HttpServer(HttpServerOptions options, HttpHandler handler,
                       HttpErrorHandler error_handler)
    : options_(std::move(options)),
      ioc_(options_.io_threads),
      acceptor_(net::make_strand(ioc_)),
      active_(std::make_shared<std::atomic<int64_t>>(0)) {
  shared_ = std::make_shared<const ConnectionShared>(
      ConnectionShared{options_, std::move(handler), std::move(error_handler), active_});
}

HttpServer::~HttpServer() { Stop(); }

Status HttpServer::Start() {
  beast::error_code ec;
  const auto address = net::ip::make_address(options_.host, ec);
  if (ec) return InvalidArgument("--host '{}' is not an IP address", options_.host);
  const tcp::endpoint endpoint(address, options_.port);
  acceptor_.open(endpoint.protocol(), ec);
  if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_.bind(endpoint, ec);
  if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
  if (ec) return IoError("cannot listen on {}:{}: {}", options_.host, options_.port, ec.message());
  port_ = acceptor_.local_endpoint().port();
  Accept();
  for (int i = 0; i < std::max(1, options_.io_threads); ++i) {
    threads_.emplace_back([this] { ioc_.run(); });
  }
  return OkStatus();
}

void HttpServer::Accept() {
  acceptor_.async_accept(net::make_strand(ioc_), [this](beast::error_code ec, tcp::socket socket) {
    if (ec == net::error::operation_aborted || !acceptor_.is_open()) return;
    if (!ec) {
      socket.set_option(tcp::no_delay(true), ec);
      std::make_shared<Connection>(std::move(socket), shared_)->Start();
    } else {
      log::Warn("accept failed: {}", ec.message());
    }
    Accept();
  });
}

void HttpServer::StopAccepting() {
  net::post(acceptor_.get_executor(), [this] {
    beast::error_code ec;
    acceptor_.close(ec);
  });
}

void HttpServer::Stop() {
  if (threads_.empty()) return;
  ioc_.stop();
  for (auto& t : threads_) t.join();
  threads_.clear();
}

}  // namespace dinfer::server
