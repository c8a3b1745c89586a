#include "backend/cuda/stream.h"

#include <cuda_runtime.h>

#include "backend/cuda/device.h"

namespace dinfer::cuda {

StatusOr<Stream> Stream::Create() {
  Stream s;
  DINFER_RETURN_IF_ERROR(
      CudaStatus(cudaStreamCreateWithFlags(&s.s_, cudaStreamNonBlocking), "cudaStreamCreate"));
  return s;
}

Stream& Stream::operator=(Stream&& o) noexcept {
  if (this != &o) {
    if (s_ != nullptr) cudaStreamDestroy(s_);
    s_ = o.s_;
    o.s_ = nullptr;
  }
  return *this;
}

Stream::~Stream() {
  if (s_ != nullptr) cudaStreamDestroy(s_);
}

Status Stream::Synchronize() const {
  return CudaStatus(cudaStreamSynchronize(s_), "cudaStreamSynchronize");
}

StatusOr<Event> Event::Create(bool timing) {
  Event e;
  const unsigned flags = timing ? cudaEventDefault : cudaEventDisableTiming;
  DINFER_RETURN_IF_ERROR(CudaStatus(cudaEventCreateWithFlags(&e.e_, flags), "cudaEventCreate"));
  return e;
}

Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    if (e_ != nullptr) cudaEventDestroy(e_);
    e_ = o.e_;
    o.e_ = nullptr;
  }
  return *this;
}

Event::~Event() {
  if (e_ != nullptr) cudaEventDestroy(e_);
}

Status Event::Record(const Stream& stream) const {
  return CudaStatus(cudaEventRecord(e_, stream.get()), "cudaEventRecord");
}

Status Event::Synchronize() const {
  return CudaStatus(cudaEventSynchronize(e_), "cudaEventSynchronize");
}

StatusOr<float> Event::ElapsedMs(const Event& start, const Event& end) {
  float ms = 0;
  DINFER_RETURN_IF_ERROR(CudaStatus(cudaEventElapsedTime(&ms, start.e_, end.e_), "elapsed time"));
  return ms;
}

Graph& Graph::operator=(Graph&& o) noexcept {
  if (this != &o) {
    if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
    exec_ = o.exec_;
    o.exec_ = nullptr;
  }
  return *this;
}

Graph::~Graph() {
  if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
}

Status Graph::BeginCapture(const Stream& stream) {
  // Thread-local mode: other threads' unrelated CUDA calls do not invalidate the capture.
  return CudaStatus(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal),
                    "cudaStreamBeginCapture");
}

StatusOr<Graph> Graph::EndCapture(const Stream& stream) {
  cudaGraph_t graph = nullptr;
  DINFER_RETURN_IF_ERROR(
      CudaStatus(cudaStreamEndCapture(stream.get(), &graph), "cudaStreamEndCapture"));
  Graph g;
  const cudaError_t e = cudaGraphInstantiate(&g.exec_, graph, 0);
  cudaGraphDestroy(graph);
  DINFER_RETURN_IF_ERROR(CudaStatus(e, "cudaGraphInstantiate"));
  return g;
}

Status Graph::Launch(const Stream& stream) const {
  return CudaStatus(cudaGraphLaunch(exec_, stream.get()), "cudaGraphLaunch");
}

}  // namespace dinfer::cuda
