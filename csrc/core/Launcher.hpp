#pragma once

// The launch path: the one place that follows the stream contract (Device.hpp) for every op of
// a group, and calls the group's launch hooks (Launch.hpp) at their fixed points. It knows
// streams, events, the op's Work and task, and the watchdog that tracks them; no feature.

#include "core/Launch.hpp"
#include "core/Options.hpp"
#include "core/Watchdog.hpp"
#include "core/Work.hpp"

#include <ATen/core/ivalue.h>

#include <atomic>
#include <memory>

namespace streamnccl {

class Launcher {
 public:
  // `group` and `options`: the group's own, which outlive its launcher (its timeout and
  // blocking wait are read at each launch).
  Launcher(const c10d::Backend& group, const Options& options, std::shared_ptr<Watchdog> watchdog,
           LaunchHooks hooks);

  // Issues the op on its path's device and returns its Work; `future`, where given, is one
  // handed out before (a coalesced group's), which the op completes.
  c10::intrusive_ptr<Work> launch(Launch launch, Path& path, Steps steps,
                                  c10::intrusive_ptr<c10::ivalue::Future> future = {});

  // The ops launched so far (c10d's sequence number for the group).
  uint64_t launched() const { return seq_.load(); }
  // Timed ops get an event before them as well as after (Work::getDuration, completion hooks).
  void setTimed() { timed_.store(true); }

  static c10::intrusive_ptr<c10::ivalue::Future> makeFuture(const Device& device);

 private:
  struct Issued;
  OpInfo describe(const Launch& launch, const Path& path);
  // An op captured into a CUDA graph: its communicator ready and tied to the graph, and a
  // future made now, which the capture completes.
  static void enterCapture(Path& path, c10::intrusive_ptr<c10::ivalue::Future>& future);
  void enqueueSync(Issued& op);
  void enqueueAsync(Issued& op, std::vector<at::Tensor> inUse);
  static void enqueue(Issued& op, c10::Stream stream);
  static void runTask(Work& work, const Steps& steps, Communicator& communicator,
                      c10::Stream opStream, Watchdog& watchdog, bool startsWithTask);
  // The op's kernels after its calls, and its outcome: `failed`, the calls' failure, or none.
  static void settle(Work& work, const Steps& steps, Watchdog& watchdog, std::exception_ptr failed);
  static void failTask(Work& work, Watchdog& watchdog, std::exception_ptr cause);

  const c10d::Backend& group_;
  const Options& options_;
  const std::shared_ptr<Watchdog> watchdog_;
  const LaunchHooks hooks_;
  std::atomic<uint64_t> seq_{0};
  std::atomic<bool> timed_{false};
};

}  // namespace streamnccl
