#pragma once

#include "core/Communicator.hpp"
#include "host/LazyGloo.hpp"

#include <atomic>
#include <functional>
#include <mutex>
#include <optional>

#include <torch/csrc/distributed/c10d/Backend.hpp>

namespace streamnccl {

// The Communicator of the host path, over a Gloo backend made in Python (Gloo's headers are
// not shipped with torch, so it is driven through the c10d::Backend interface). Each call
// runs the Gloo op to completion on the calling thread, which is the host stream executing
// the op's task; a Gloo failure propagates as an exception to the op's task.
class HostCommunicator final : public Communicator {
 public:
  // `tag`: the Gloo tag of this communicator's sends and recvs. Communicators whose streams
  // run concurrently (the group's and its peer lanes) must not share one, or Gloo could
  // match a message with a recv posted by another stream. `opened`: where each op first waits
  // for the ranks it exchanges with to have opened Gloo (null: they all have).
  HostCommunicator(c10::intrusive_ptr<c10d::Backend> gloo, int tag,
                   std::shared_ptr<LazyGloo> opened = nullptr);

  bool supportsAvg(at::ScalarType) const override { return false; }        // Gloo has no AVG
  bool supportsPreMulSum(at::ScalarType) const override { return false; }  // nor PREMUL_SUM
  void allReduce(const at::Tensor& input, const at::Tensor& output, const ReduceOp& op,
                 c10::Stream stream) override;
  void broadcast(const at::Tensor& input, const at::Tensor& output, int root,
                 c10::Stream stream) override;
  void allGather(const at::Tensor& input, const at::Tensor& output, c10::Stream stream) override;
  void reduce(const at::Tensor& input, const at::Tensor& output, const ReduceOp& op, int root,
              c10::Stream stream) override;
  void reduceScatter(const at::Tensor& input, const at::Tensor& output, const ReduceOp& op,
                     c10::Stream stream) override;
  // Gloo's own all-to-all: one exchange, where sends and recvs would be one Gloo op each.
  AllToAll allToAllKind() const override { return AllToAll::AnyBlocks; }
  void allToAll(const at::Tensor& input, const at::Tensor& output,
                const std::vector<int64_t>& inSplits, const std::vector<int64_t>& outSplits,
                c10::Stream stream) override;
  void send(const at::Tensor& input, int peer, c10::Stream stream) override;
  void recv(const at::Tensor& output, int peer, c10::Stream stream) override;
  int recvFromAnySource(const at::Tensor& output, c10::Stream stream) override;
  void groupStart() override;
  void groupEnd() override;
  // Gloo cannot be interrupted through c10d's Backend: a blocked Gloo op ends at its own
  // timeout, the group's, or once its peers close their connections. So abort() lets go of
  // Gloo (LazyGloo::close(); at once, or once the op in Gloo returns): once every communicator
  // of the group has, Gloo closes this rank's connections, which ends its peers' exchanges with
  // it. Calls after abort() fail at once instead of reaching Gloo.
  void abort() override;
  // Gloo reports every fault through the op that meets it.
  std::string asyncError() override { return {}; }

 private:
  // A Gloo call, and the rank it exchanges with (nullopt: every member).
  struct Grouped {
    std::optional<int> peer;
    std::function<c10::intrusive_ptr<c10d::Work>()> post;
  };
  // Outside a group, posts the Gloo call once `peer` (every member, when nullopt) has opened
  // Gloo, and waits for it; inside one, keeps it for the outermost groupEnd().
  template <typename Post>
  void issue(std::optional<int> peer, Post post);
  // Posts the group's calls, each once its peers have opened Gloo; raises at the group's
  // timeout or abort(). `posted`: what was posted, for the caller to wait for.
  void postGrouped(std::vector<Grouped>& grouped,
                   std::vector<c10::intrusive_ptr<c10d::Work>>& posted);
  void refuseIfAborted() const;
  // Held while Gloo runs a call of this communicator's (on the host stream's executor): abort()
  // lets go of gloo_ only while none is held, or as the last one ends.
  class InGloo {
   public:
    explicit InGloo(HostCommunicator& communicator);
    ~InGloo();
    InGloo(const InGloo&) = delete;
    InGloo& operator=(const InGloo&) = delete;

   private:
    HostCommunicator& communicator_;
  };
  // With glooMutex_ held: gloo_, once aborted and out of Gloo, to be let go of without it.
  c10::intrusive_ptr<c10d::Backend> releasable();
  // A copy of `input` that Gloo may overwrite (a non-root rank's reduce), in a buffer kept for
  // the next one: a fresh allocation of a large buffer costs more than the copy itself.
  at::Tensor copyToScratch(const at::Tensor& input);
  static constexpr int64_t kKeptScratchBytes = 64 << 20;  // larger ones are not kept

  std::mutex glooMutex_;
  c10::intrusive_ptr<c10d::Backend> gloo_;  // null once let go of (abort())
  int inGloo_ = 0;                          // calls in Gloo now (InGloo)
  const int rank_;
  const int tag_;
  const std::shared_ptr<LazyGloo> opened_;
  std::atomic<bool> aborted_{false};
  // Touched only by the host stream's executor, one task at a time.
  int groupDepth_ = 0;
  std::vector<Grouped> grouped_;
  at::Tensor scratch_;  // bytes, for copyToScratch()
};

}  // namespace streamnccl
