#pragma once

#include "core/Communicator.hpp"

#include <torch/csrc/distributed/c10d/Backend.hpp>

namespace streamnccl {

// The Communicator of the host path, over a Gloo backend made in Python (Gloo's headers are
// not shipped with torch, so it is driven through the c10d::Backend interface). Each call
// runs the Gloo op to completion on the calling thread, which is the host stream executing
// the op's task; a Gloo failure propagates as an exception to the op's task.
class HostCommunicator final : public Communicator {
 public:
  explicit HostCommunicator(c10::intrusive_ptr<c10d::Backend> gloo);

  bool supportsAvg(at::ScalarType) const override { return false; }  // Gloo has no AVG
  void allReduce(const at::Tensor& input, const at::Tensor& output, ReduceKind op,
                 c10::Stream stream) override;
  void broadcast(const at::Tensor& input, const at::Tensor& output, int root,
                 c10::Stream stream) override;
  void allGather(const at::Tensor& input, const at::Tensor& output, c10::Stream stream) override;

 private:
  const c10::intrusive_ptr<c10d::Backend> gloo_;
};

}  // namespace streamnccl
