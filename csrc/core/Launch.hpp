#pragma once

// What the launch path is handed for one op, and the hooks it calls at fixed points. The path
// itself (Launcher.hpp) follows the stream contract and nothing else; every feature that looks
// at ops as they are launched (the flight recorder's sequencing, the profiler's range, stats,
// the in-flight write check, the debug same-op check, fault injection, completion hooks'
// issue times) is a hook in csrc/core/hooks/, registered when the group is made.

#include "core/Communicator.hpp"
#include "core/FlightRecorder.hpp"
#include "core/Kernels.hpp"
#include "core/OpInfo.hpp"
#include "core/Path.hpp"
#include "core/TensorList.hpp"

#include <torch/csrc/distributed/c10d/Types.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <type_traits>
#include <vector>

namespace streamnccl {

class Work;

// One op's work on its stream. `issue` makes the communicator calls (inside a group when
// coalesced), with the kernels that prepare their buffers; `finish` then copies results where
// the caller wants them, after the calls in stream order. Both run inside the op's enqueued
// task, and issue every ATen kernel through the Kernels they are given.
struct Steps {
  std::function<void(Transport&, Kernels&, c10::Stream)> issue;
  std::function<void(Kernels&)> finish;
  std::shared_ptr<void> shared;  // what the two use (see over()), alive as long as they are

  // Steps whose two closures share a `Scratch` (what `issue` leaves for `finish`: dense
  // copies, buffers computed in), called as issue(scratch, comm, kernels, stream) and
  // finish(scratch, kernels) (`finish` may be nullptr). The scratch and both closures are
  // made in one allocation; the std::functions hold only a pointer to it, which they store
  // inline: one allocation for every op's launch.
  template <typename Scratch, typename Issue, typename Finish>
  static Steps over(Issue issue, Finish finish) {
    return over(Scratch{}, std::move(issue), std::move(finish));
  }
  // The same, the scratch starting as `scratch`: what both closures use (the op's tensor) is
  // held there once, rather than captured by each.
  template <typename Scratch, typename Issue, typename Finish>
  static Steps over(Scratch scratch, Issue issue, Finish finish) {
    struct Shared {
      Scratch scratch;
      Issue issue;
      Finish finish;
    };
    auto shared =
        std::make_shared<Shared>(Shared{std::move(scratch), std::move(issue), std::move(finish)});
    Shared* one = shared.get();
    Steps steps{[one](Transport& comm, Kernels& kernels, c10::Stream stream) {
                  one->issue(one->scratch, comm, kernels, stream);
                },
                nullptr, std::move(shared)};
    if constexpr (!std::is_same_v<Finish, std::nullptr_t>) {
      steps.finish = [one](Kernels& kernels) { one->finish(one->scratch, kernels); };
    }
    return steps;
  }
};

// One op as the group's lowering hands it to the launch.
struct Launch {
  const char* op;
  c10d::OpType opType;
  const at::Tensor& shapeOf;  // the tensor whose shape and dtype messages quote
  TensorList inputs;
  std::vector<at::Tensor> outputs;
  bool async;
  std::chrono::milliseconds timeout;  // kUnsetTimeout: the group's
  bool blockHostOnWait = false;
  // A recv from any source: where its task writes the sender, for the Work to report.
  std::shared_ptr<std::atomic<int>> sourceRank = nullptr;
  int peer = -1;                         // a send's or recv's, for the flight recorder
  std::vector<int64_t> inputSplitSizes;  // all_to_all's, for the profiler
  std::vector<int64_t> outputSplitSizes;
};

bool isPointToPoint(c10d::OpType opType);

// What a hook sees of one op being launched.
struct LaunchedOp {
  const Launch& launch;  // its inputs and outputs until the Work takes them (see issued())
  // Described and numbered (info.seq); launched() hooks may fill in info.traceId. In issued()
  // the Work holds it (work.info()), and this one is moved from.
  OpInfo& info;
  Steps& steps;  // hooks may wrap them
  Path& path;
  bool captured;  // into a CUDA graph: it runs at replays, and is neither tracked nor timed
  std::chrono::milliseconds timeout;
  RecorderClock& clock;  // read at most once for the whole launch
};

// A feature that looks at every op its group launches. Called on the launching thread, in the
// order the hooks were registered, at two fixed points. A launched() hook that throws refuses
// the op, which is then not issued (the hooks before it have seen it: the flight recorder's
// entry of a refused op says so); issued() hooks must not throw. A hook registered costs its
// calls; one not registered costs nothing.
class LaunchHook {
 public:
  virtual ~LaunchHook() = default;
  // Before the op's Work is made. What a hook starts here may end when the launch returns
  // (the profiler's range): it keeps it in the returned handle, which the launch holds.
  virtual std::shared_ptr<void> launched(LaunchedOp& /*op*/) { return nullptr; }
  // The Work is made (it holds the op's outputs now: work.outputs()), nothing is enqueued yet.
  virtual void issued(LaunchedOp& /*op*/, Work& /*work*/) {}
};

using LaunchHooks = std::vector<std::unique_ptr<LaunchHook>>;

}  // namespace streamnccl
