#pragma once

#include "core/Options.hpp"
#include "core/Path.hpp"
#include "core/Work.hpp"

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <atomic>
#include <deque>
#include <functional>
#include <mutex>
#include <unordered_map>

namespace streamnccl {

// The c10d::Backend registered as "streamnccl". It validates every call, lowers it to
// buffer-level Communicator calls and launches them through launch(), which follows the
// stream contract written in Device.hpp. It knows neither CUDA, NCCL nor Gloo: the paths for
// each device type come from the PathFactory given at construction.
class ProcessGroup final : public c10d::Backend {
 public:
  using PathFactories = std::unordered_map<c10::DeviceType, std::unique_ptr<PathFactory>>;

  ProcessGroup(int rank, int size, c10::intrusive_ptr<streamnccl::Options> options,
               PathFactories factories);
  ~ProcessGroup() override;

  const std::string getBackendName() const override { return kBackendName; }
  c10::intrusive_ptr<c10d::Backend::Options> getBackendOptions() override { return options_; }
  const c10::intrusive_ptr<streamnccl::Options>& options() const { return options_; }
  uint64_t getSequenceNumberForGroup() override { return seq_.load(); }
  void setTimeout(std::chrono::milliseconds timeout) override { options_->timeout = timeout; }

  c10::intrusive_ptr<c10d::Work> allreduce(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> broadcast(
      std::vector<at::Tensor>& tensors,
      const c10d::BroadcastOptions& opts = c10d::BroadcastOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather(
      std::vector<std::vector<at::Tensor>>& outputTensors, std::vector<at::Tensor>& inputTensors,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> barrier(
      const c10d::BarrierOptions& opts = c10d::BarrierOptions()) override;

 private:
  // Issues one op's buffer-level work on `stream`. Runs inside the op's task.
  using Body = std::function<void(Communicator&, c10::Stream)>;

  struct Launch {
    const char* op;
    c10d::OpType opType;
    const at::Tensor& shapeOf;  // the tensor whose shape and dtype messages quote
    std::vector<at::Tensor> inputs;
    std::vector<at::Tensor> outputs;
    bool async;
    std::chrono::milliseconds timeout;  // kUnsetTimeout: the group's
    bool blockHostOnWait = false;
  };

  Path& pathFor(const c10::Device& device, const char* op);
  c10::intrusive_ptr<Work> launch(Launch launch, Path& path, Body body);
  // Keeps an async op's Work (and so its tensors) until it completes; drops completed ones.
  void trackInFlight(c10::intrusive_ptr<Work> work);
  c10::Device barrierDevice(const c10d::BarrierOptions& opts) const;

  // Qualified: inside this class `Options` names c10d::Backend::Options.
  const c10::intrusive_ptr<streamnccl::Options> options_;
  const PathFactories factories_;

  mutable std::mutex pathsMutex_;
  std::unordered_map<c10::Device, std::unique_ptr<Path>> paths_;
  std::optional<c10::Device> lastAcceleratorDevice_;

  std::atomic<uint64_t> seq_{0};

  std::mutex inFlightMutex_;
  std::deque<c10::intrusive_ptr<Work>> inFlight_;
};

}  // namespace streamnccl
