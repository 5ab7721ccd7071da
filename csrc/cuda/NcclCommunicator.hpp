#pragma once

#include "core/Communicator.hpp"
#include "cuda/CudaApi.hpp"
#include "cuda/NcclApi.hpp"
#include "cuda/NcclConnection.hpp"

#include <c10/core/Device.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace streamnccl {

// The key of a shrink's or split's own Store where a member that gives up on it says why.
inline constexpr const char* kChildFailedKey = "failed";

// Which ranks of the group an ncclComm_t spans, and under what name it meets them.
struct NcclMembership {
  // Group ranks in communicator rank order; empty means the whole group in rank order.
  std::vector<int> members;
  // The Store key the unique id is published under; every member opens it with the same key.
  std::string idKey;
  // How errors name this communicator: "[streamnccl rank r/n cuda:d]" and the like.
  std::string who;
  // How NCCL names it in its own log (NCCL_DEBUG=INFO): the group's name, and the lane.
  std::string name;
};

// The Communicator of the NCCL path: a 1:1 mapping of the interface onto NCCL calls (through
// NcclApi) on the given stream, over one NcclConnection, which connects in the background and
// makes each call a Use. Roots and peers are group ranks, translated to the communicator's own
// ranks when it spans only some of the group.
class NcclCommunicator final : public Communicator {
 public:
  // Starts connecting to the other members, which each make one with the same `idKey`.
  NcclCommunicator(std::shared_ptr<NcclApi> nccl, std::shared_ptr<CudaApi> cuda,
                   c10::intrusive_ptr<c10d::Store> store, int groupRank, int groupSize,
                   c10::Device device, NcclMembership membership, std::chrono::milliseconds timeout,
                   Options::NcclConfig config);
  ~NcclCommunicator() override;

  // Whether NCCL can still shrink this communicator: connected, neither aborted nor closed.
  bool live() { return connection_->live(); }
  // Starts making the communicator of this one's members but the `excluded` group ranks
  // (sorted) from it (ncclCommShrink), in which this rank is `groupRank` of `groupSize`; with
  // `abortInFlight`, this one's operations in flight end first. Only of a communicator over
  // the whole group; every survivor makes it at once, as with NCCL.
  // `store` is the survivors' own for this shrink, where one that gives up says why; `timeout`
  // and `config` are the new group's.
  std::shared_ptr<NcclCommunicator> shrunk(const std::vector<int>& excluded, bool abortInFlight,
                                           int groupRank, int groupSize, std::string who,
                                           std::chrono::milliseconds timeout,
                                           Options::NcclConfig config,
                                           c10::intrusive_ptr<c10d::Store> store) const;
  // Starts making, from this communicator (ncclCommSplit), the communicator of its members
  // that pass the same `color`, in which this rank is `groupRank` of `groupSize` (the new
  // group's ranks are in this one's order). Only of a communicator over the whole group; every
  // member of it takes part at once, as with NCCL, those joining none through
  // splitWithoutColor(). `store` is the split's own, where one that gives up says why; `tag`
  // names the new one among this one's children; `timeout` and `config` are the new group's.
  std::shared_ptr<NcclCommunicator> split(int color, int groupRank, int groupSize, std::string who,
                                          const std::string& tag, std::chrono::milliseconds timeout,
                                          Options::NcclConfig config,
                                          c10::intrusive_ptr<c10d::Store> store) const;
  // This member's part in a split that makes it no new communicator (NCCL_SPLIT_NOCOLOR):
  // returns once every member has split; raises DistBackendError when they do not within
  // `timeout` (having aborted this communicator, the only way to end NCCL's part in it).
  void splitWithoutColor(std::chrono::milliseconds timeout,
                         c10::intrusive_ptr<c10d::Store> store) const;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  // Runs `callback` once connecting has ended, well or not (see NcclConnection).
  void whenConnected(std::function<void()> callback) {
    connection_->whenSettled(std::move(callback));
  }

  bool supportsAvg(at::ScalarType dtype) const override;
  bool supportsPreMulSum(at::ScalarType dtype) const override;
  std::string reductionRefusal(ReduceKind kind, at::ScalarType dtype) const override;
  void allReduce(const at::Tensor& input, const at::Tensor& output, const ReduceOp& op,
                 c10::Stream stream) override;
  void broadcast(const at::Tensor& input, const at::Tensor& output, int root,
                 c10::Stream stream) override;
  void allGather(const at::Tensor& input, const at::Tensor& output, c10::Stream stream) override;
  void reduce(const at::Tensor& input, const at::Tensor& output, const ReduceOp& op, int root,
              c10::Stream stream) override;
  void reduceScatter(const at::Tensor& input, const at::Tensor& output, const ReduceOp& op,
                     c10::Stream stream) override;
  // ncclAlltoAll (NCCL 2.28+), on a communicator whose ranks are the group's.
  AllToAll allToAllKind() const override {
    return members_.empty() && allToAllLoaded_ ? AllToAll::EqualBlocks : AllToAll::None;
  }
  void allToAll(const at::Tensor& input, const at::Tensor& output,
                const std::vector<int64_t>& inSplits, const std::vector<int64_t>& outSplits,
                c10::Stream stream) override;
  void send(const at::Tensor& input, int peer, c10::Stream stream) override;
  void recv(const at::Tensor& output, int peer, c10::Stream stream) override;
  void groupStart() override;
  void groupEnd() override;
  void waitReady() override { connection_->waitConnected(); }
  void stopConnecting() override { connection_->abandon(); }
  void abort() override { connection_->abort(); }
  void setBreakRequest(BreakRequest request) override {
    connection_->setBreakRequest(std::move(request));
  }
  void beginClose() override { connection_->beginClose(); }
  std::string endClose(std::chrono::steady_clock::time_point deadline) override {
    return connection_->endClose(deadline);
  }
  void noteCaptured() override { connection_->noteCaptured(); }
  const std::string& key() const override { return key_; }
  std::string asyncError() override { return connection_->asyncError(); }
  // NcclMemory.cpp: ncclCommRegister and ncclCommDeregister, the handles kept by address.
  void registerMemory(void* address, size_t bytes, const std::string& who) override;
  void deregisterMemory(void* address, const std::string& who) override;
  bool isRegistered(void* address) override {
    std::lock_guard<std::mutex> lock(registrationsMutex_);
    return registrations_.count(address) > 0;
  }

 private:
  // shrunk()'s and split()'s: the communicator NCCL makes from this one as `origin` says,
  // named and keyed after this one and `tag`.
  std::shared_ptr<NcclCommunicator> child(const std::string& tag, NcclConnection::ChildOf origin,
                                          int groupRank, int groupSize, std::string who,
                                          std::chrono::milliseconds timeout,
                                          Options::NcclConfig config,
                                          c10::intrusive_ptr<c10d::Store> store) const;
  class ScopedRedOp;
  // Over a connection made already (shrunk()), spanning the whole group.
  NcclCommunicator(std::shared_ptr<NcclApi> nccl, std::shared_ptr<CudaApi> cuda, c10::Device device,
                   std::string who, std::string key, std::shared_ptr<NcclConnection> connection,
                   Options::NcclConfig config, std::string name);
  int commRank(int groupRank) const;

  const std::shared_ptr<NcclApi> nccl_;
  const std::shared_ptr<CudaApi> cuda_;
  const std::string who_;
  const std::vector<int> members_;
  const c10::Device device_;
  const int computeCapability_;
  const std::string key_;             // the unique id's Store key, the same on every member
  const Options::NcclConfig config_;  // what it was made with, and a shrunk one is
  const std::string name_;            // NCCL's name for it
  const bool allToAllLoaded_;         // the NCCL loaded has ncclAlltoAll
  const std::shared_ptr<NcclConnection> connection_;
  int groupDepth_ = 0;  // touched by the one task issuing on this communicator at a time
  std::mutex registrationsMutex_;
  std::map<void*, void*> registrations_;  // address -> NCCL's handle (null: none made)
};

// The NCCL version this extension was compiled against and the one loaded at run time.
int ncclCompiledVersion();
int ncclLoadedVersion();

}  // namespace streamnccl
