// Streams, events and CUDA graphs as owning handles. A Stream orders work on the device; an Event
// marks a point in a stream (for waiting and for timing); a Graph replays work captured from a
// stream with one launch.
// Thread-safety: handles are movable, not copyable; one thread uses a stream at a time.
#pragma once

#include "base/status.h"

// CUDA's opaque handle types, declared here so that users need no CUDA headers.
struct CUstream_st;
struct CUevent_st;
struct CUgraphExec_st;

namespace dinfer::cuda {

class Stream {
 public:
  // A non-blocking stream (does not synchronise with the legacy default stream).
  static StatusOr<Stream> Create();
  Stream() = default;
  Stream(Stream&& o) noexcept : s_(o.s_) { o.s_ = nullptr; }
  Stream& operator=(Stream&& o) noexcept;
  ~Stream();

  CUstream_st* get() const { return s_; }
  Status Synchronize() const;

 private:
  CUstream_st* s_ = nullptr;
};

class Event {
 public:
  // timing: whether the event records a time stamp (costs a little on record).
  static StatusOr<Event> Create(bool timing = false);
  Event() = default;
  Event(Event&& o) noexcept : e_(o.e_) { o.e_ = nullptr; }
  Event& operator=(Event&& o) noexcept;
  ~Event();

  Status Record(const Stream& stream) const;
  Status Synchronize() const;
  // Milliseconds between two recorded timing events (both finished).
  static StatusOr<float> ElapsedMs(const Event& start, const Event& end);

 private:
  CUevent_st* e_ = nullptr;
};

// Work captured from a stream (kernels, copies, library calls) and instantiated for replay.
class Graph {
 public:
  Graph() = default;
  Graph(Graph&& o) noexcept : exec_(o.exec_) { o.exec_ = nullptr; }
  Graph& operator=(Graph&& o) noexcept;
  ~Graph();

  // Work enqueued on `stream` between the two calls is captured instead of run.
  static Status BeginCapture(const Stream& stream);
  static StatusOr<Graph> EndCapture(const Stream& stream);
  Status Launch(const Stream& stream) const;
  bool empty() const { return exec_ == nullptr; }

 private:
  CUgraphExec_st* exec_ = nullptr;
};

}  // namespace dinfer::cuda
