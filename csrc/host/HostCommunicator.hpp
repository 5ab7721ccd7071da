#pragma once

#include "core/Communicator.hpp"
#include "host/HostStream.hpp"
#include "host/LazyGloo.hpp"

#include <atomic>
#include <functional>
#include <mutex>
#include <optional>

#include <torch/csrc/distributed/c10d/Backend.hpp>

namespace streamnccl {

// The Communicator of the host path, over a Gloo backend made in Python (Gloo's headers are
// not shipped with torch, so it is driven through the c10d::Backend interface). Each call
// posts its Gloo op. On the caller's stream (a sync op) it waits for it there, and a Gloo
// failure propagates as an exception to the op's task; on the internal stream it hands it to
// the stream (HostStream::awaitCall), which settles the op once Gloo has completed it, with
// its failure if it failed: as an NCCL call is enqueued on a CUDA stream.
class HostCommunicator final : public Communicator {
 public:
  // `tag`: the Gloo tag of this communicator's sends and recvs. Communicators whose streams
  // run concurrently (the group's and its peer lanes) must not share one, or Gloo could
  // match a message with a recv posted by another stream. `stream`: the internal stream of
  // the path's device (a HostDevice's), which its calls on it are handed to (null: every call
  // is waited for where it is made, as on the simulated device, whose streams are threads).
  // `opened`: where each op first waits for the ranks it exchanges with to have opened Gloo
  // (null: they all have).
  HostCommunicator(c10::intrusive_ptr<c10d::Backend> gloo, int tag,
                   std::shared_ptr<HostStream> stream = nullptr,
                   std::shared_ptr<LazyGloo> opened = nullptr);
  // On a thread of Gloo's (an op's future callback let go of the group there), Gloo is let go
  // of on a thread of its own: its destructor joins its threads, this one among them.
  ~HostCommunicator() override;

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
  // Gloo's collectives cannot be interrupted through c10d's Backend: one ends at its own
  // timeout, the group's, or once its peers close their connections. So abort() lets go of
  // Gloo (LazyGloo::close(); at once, or once the op in Gloo returns): once every communicator
  // of the group has, Gloo closes this rank's connections, which ends its peers' exchanges with
  // it. The stream's waits for sends and receives end at once (HostStream::abortCalls). Calls
  // after abort() fail at once instead of reaching Gloo.
  void abort() override;
  // Gloo reports every fault through the op that meets it.
  std::string asyncError() override { return {}; }

 private:
  using Completion = HostStream::Completion;
  // A Gloo call, the rank it exchanges with (nullopt: every member), and how it completes.
  struct Grouped {
    std::optional<int> peer;
    Completion completion;
    std::function<c10::intrusive_ptr<c10d::Work>()> post;
  };
  // Outside a group, posts the Gloo call once `peer` (every member, when nullopt) has opened
  // Gloo, and sees it through (finish()); inside one, keeps it for the outermost groupEnd().
  template <typename Post>
  void issue(c10::Stream stream, std::optional<int> peer, Completion completion, Post post);
  // Whether a call on `stream` is handed to the internal stream rather than waited for.
  bool handsOver(c10::Stream stream) const;
  // Waits for a posted call, or hands it to the internal stream (handsOver()).
  void finish(c10::Stream stream, const c10::intrusive_ptr<c10d::Work>& work,
              Completion completion);
  // Posts the group's calls, each once its peers have opened Gloo; raises at the group's
  // timeout or abort(). `posted`: what was posted, for the caller to see through.
  void postGrouped(std::vector<Grouped>& grouped,
                   std::vector<std::pair<c10::intrusive_ptr<c10d::Work>, Completion>>& posted);
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
  // A copy of `input` that Gloo may overwrite (a non-root rank's reduce): where the call is
  // waited for on `stream`, in a buffer kept for the next one (a fresh allocation of a large
  // buffer costs more than the copy itself); else one of its own.
  at::Tensor copyToScratch(const at::Tensor& input, c10::Stream stream);
  static constexpr int64_t kKeptScratchBytes = 64 << 20;  // larger ones are not kept

  std::mutex glooMutex_;
  c10::intrusive_ptr<c10d::Backend> gloo_;  // null once let go of (abort())
  int inGloo_ = 0;                          // calls in Gloo now (InGloo)
  const int rank_;
  const int tag_;
  const std::shared_ptr<HostStream> stream_;
  const std::shared_ptr<LazyGloo> opened_;
  std::atomic<bool> aborted_{false};
  // Touched only by the host stream's executor, one task at a time.
  int groupDepth_ = 0;
  std::vector<Grouped> grouped_;
  c10::Stream groupStream_{c10::Stream::DEFAULT, c10::Device(c10::kCPU)};  // the group's calls'
  at::Tensor scratch_;  // bytes, for copyToScratch()
};

}  // namespace streamnccl
