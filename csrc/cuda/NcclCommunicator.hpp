#pragma once

#include "core/Communicator.hpp"

#include <c10/core/Device.h>
#include <nccl.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <string>

namespace streamnccl {

// The Communicator of the NCCL path: one ncclComm_t per group and device, a 1:1 mapping of
// the interface onto NCCL calls on the given stream.
class NcclCommunicator final : public Communicator {
 public:
  // Collective: every rank calls it for the group's `ordinal`-th communicator. Rank 0 makes
  // the unique id and publishes it through `store`.
  NcclCommunicator(c10d::Store& store, int rank, int size, c10::Device device, int ordinal);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  bool supportsAvg(at::ScalarType dtype) const override;
  void allReduce(const at::Tensor& input, const at::Tensor& output, ReduceKind op,
                 c10::Stream stream) override;
  void broadcast(const at::Tensor& input, const at::Tensor& output, int root,
                 c10::Stream stream) override;
  void allGather(const at::Tensor& input, const at::Tensor& output, c10::Stream stream) override;
  void reduce(const at::Tensor& input, const at::Tensor& output, ReduceKind op, int root,
              c10::Stream stream) override;
  void reduceScatter(const at::Tensor& input, const at::Tensor& output, ReduceKind op,
                     c10::Stream stream) override;
  void send(const at::Tensor& input, int peer, c10::Stream stream) override;
  void recv(const at::Tensor& output, int peer, c10::Stream stream) override;
  void groupStart() override;
  void groupEnd() override;

 private:
  const std::string who_;
  ncclComm_t comm_ = nullptr;
};

// The NCCL version this extension was compiled against and the one loaded at run time.
int ncclCompiledVersion();
int ncclLoadedVersion();

}  // namespace streamnccl
