#pragma once

#include "core/Work.hpp"

#include <c10/util/FunctionRef.h>
#include <c10/util/SmallVector.h>

#include <deque>
#include <vector>

namespace streamnccl {

// A group's ops whose end has not passed, in launch order, with the streams their ends are on
// and how many ops each has. Ops on one stream end in the order they were enqueued, so a look
// that meets one still running may skip the later ones on its stream. Not locked: the
// Watchdog holds its lock around every call.
class OpsInFlight {
 public:
  using Works = std::vector<c10::intrusive_ptr<Work>>;
  // How far a look goes.
  enum class Look {
    All,                  // every op: the watchdog's period, a break, the group's end
    UntilEachStreamRuns,  // in launch order, skipping the ops behind one still running on
                          // their stream, until one is met on every stream with ops in flight:
                          // a launch's, whose cost must not grow with the ops queued
  };
  // Offered an op, returns whether it leaves (its end has passed, or it faulted): then it has
  // moved it out of `work`.
  using Leaves = c10::function_ref<bool(c10::intrusive_ptr<Work>& work)>;

  void add(c10::intrusive_ptr<Work> work);
  // Offers the ops that `look` reaches to `leaves`, in launch order. Only the part looked at
  // is moved about, so a launch's look costs the same with 10 or 10,000 ops queued.
  void look(Look how, Leaves leaves);
  // Moves the ops for which `take` holds to the end of `to`, keeping the order of both.
  void takeWhere(c10::function_ref<bool(Work&)> take, Works& to);
  Works takeAll();
  const std::deque<c10::intrusive_ptr<Work>>& ops() const { return ops_; }

 private:
  struct StreamOf {
    Work::EndStream end;
    size_t ops;
  };
  // The stream `work` ends on, or streams_.end().
  StreamOf* streamOf(const Work& work);
  // An op leaves: its stream's count goes down, and the stream goes at 0 (a launch's look
  // would otherwise wait to meet a running op there, and look at every op).
  void countOut(const Work& work);

  std::deque<c10::intrusive_ptr<Work>> ops_;
  c10::SmallVector<StreamOf, 4> streams_;
};

}  // namespace streamnccl
