#pragma once

// The stream contract. Launcher::launch() (Launcher.hpp) is the one place that follows it;
// every op goes through there. Per process group and device:
//
//  1. async_op=False: the op is enqueued on the caller's current stream. No internal stream,
//     and no stream ever waits for an event; one event `end` is recorded after the op so the
//     watchdog can time it out. The host returns once the op is enqueued, not when it has run.
//  2. async_op=True: an event `ready` is recorded on the caller's current stream and the
//     internal stream waits on it (the host never blocks); the op is enqueued on the internal
//     stream; an event `end` is recorded after it and kept by the returned Work.
//  3. work.wait() makes the caller's *current* stream (at the time of wait) wait on `end`;
//     the host is not blocked. wait(timeout), or the blockingWait option, also blocks the host
//     until `end` completes, and raises DistBackendError once the timeout has passed.
//  4. work.is_completed() queries `end` without blocking. work.get_future()'s future is made
//     at the first ask. Asked before the op settled, it is completed from inside the op's
//     enqueued task, after the op's own kernels (copy-backs, AVG's division), so on CUDA it
//     is marked with the op's stream current; asked after, it is made completed, its device
//     events following `end` (completedFuture below). Either way then() callbacks (DDP comm
//     hooks) are ordered after the whole op.
//  5. Every input and output of an async op stays referenced by its Work until `end` has
//     completed (and no longer: once it has, the next call on the group, or wait(), lets them
//     go; an op launched at the same moment as an earlier one of its stream, from another
//     thread, may wait for that one's end or the watchdog's next look, 50 ms), so memory is
//     never handed back to the allocator while the op may still touch it.
//     A failed op's too: its kernels after the communicator's (copy-backs, divisions) still
//     run once the communicator is aborted. An op captured into a CUDA graph runs at every
//     replay: its Work holds its tensors and temporaries until wait() has joined it to the
//     caller's stream (or the group ends), as ProcessGroupNCCL does.
//  6. Ops of one group on one device are enqueued in program order; internal streams are made
//     lazily, one per device (optionally high priority). A send or recv outside a group is
//     the exception: it runs on its lane (Path.hpp), a stream per peer and direction, in
//     program order with the other ops of that lane only, so a pending recv blocks nothing
//     else. Its `ready` event still orders it after the caller's earlier work.
//  7. Coalesced ops (startCoalescing/endCoalescing, *_coalesced, batch_isend_irecv) are
//     issued as one communicator group inside one task on the internal stream: one Work.
//
// As a timeline, for one async op (● records an event, ◆ makes a stream wait for one):
//
//   caller's stream  ──[writes x]──●ready─────────────────────────◆──[reads x]──▶
//                                  │                              ▲
//   internal stream  ──────────────◆───[communicator call]──●end──┘
//   host             launch: record ready, block, enqueue, record end; wait(): block
//
// On the host path the caller's stream is the calling thread, which is synchronous (a sync op
// returns when its result is ready), and the internal stream, one per group and lane, is a
// HostStream: an op's task posts its Gloo calls (from whichever thread finds the stream
// ready) and its settle follows once Gloo has completed them, as a CUDA stream orders kernels.

#include "core/Task.hpp"

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

namespace streamnccl {

// A marker in a stream's order of work, as a CUDA event is.
class Event {
 public:
  virtual ~Event() = default;
  // Marks the point after all work enqueued on `stream` so far.
  virtual void record(c10::Stream stream) = 0;
  // Makes later work on `stream` wait for the marked point. Never blocks the host on CUDA.
  virtual void block(c10::Stream stream) = 0;
  // True once the marked work has run. Never blocks.
  virtual bool query() = 0;
  // Blocks the host until the marked work has run or `timeout` passes; false on timeout.
  virtual bool synchronize(std::chrono::milliseconds timeout) = 0;
  // The same, for a waiter that would wait until the marked work has run (a plain wait()):
  // where the device lets a waiter do on its own thread the work that point waits for (the
  // host's waits for sends and receives, which a group's break ends), it does, rather than
  // sleep while another thread does it, and may return later than `slice`.
  virtual bool waitHelping(std::chrono::milliseconds slice) { return synchronize(slice); }
  // Milliseconds from `start`, recorded earlier on the same stream, to this point, once both
  // have passed; nullopt before, or when either was not made by Device::createTimedEvent().
  virtual std::optional<double> millisecondsSince(Event& /*start*/) { return std::nullopt; }
};

// One ATen kernel of an op (see core/Kernels.hpp): `run` writes `outputs` (it may read them
// too) and reads `inputs`, given `scalar` where it takes one. A plain function, so that a
// device can run it later on tensors of its own making (the fake GPU's stream items).
struct Kernel {
  const char* name;
  void (*run)(c10::ArrayRef<at::Tensor> outputs, c10::ArrayRef<at::Tensor> inputs, int64_t scalar);
};

// The streams and events of one device, as seen by one process group.
class Device {
 public:
  virtual ~Device() = default;
  virtual c10::Device device() const = 0;
  // The stream the calling thread currently works on.
  virtual c10::Stream currentStream() = 0;
  // This group's own stream on this device, created on first use.
  virtual c10::Stream internalStream() = 0;
  virtual std::unique_ptr<Event> createEvent() = 0;
  // An event that can be timed against another (millisecondsSince); on CUDA it costs more to
  // record than a plain one, so only timed ops use it. A device without timing makes a plain one.
  virtual std::unique_ptr<Event> createTimedEvent() { return createEvent(); }
  // Whether work enqueued on `stream` now is captured into a CUDA graph (to run at each
  // replay) instead of running.
  virtual bool isCapturing(c10::Stream /*stream*/) { return false; }
  // Runs `task` in order on `stream`: the task issues one op's work (communicator calls, ATen
  // kernels), and everything it issues is ordered on `stream`. On CUDA the task runs now, on
  // the calling thread, with `stream` made current; on the host it runs on the stream's
  // executor. The task must not throw. (A device that keeps it for later takes it: see Task.)
  virtual void enqueue(c10::Stream stream, Task task) = 0;
  // Called by a task on `stream`, once it has issued its communicator calls: runs `settle`
  // (the op's kernels after the calls, its outcome) after those calls in `stream`'s order,
  // given the failure of the first of them that failed, or null. On CUDA a call's failure
  // shows later (the watchdog asks the communicator), and `settle` runs now, issuing kernels
  // after the calls'. On the host, whose calls on an internal stream complete on Gloo's side
  // after the task returns (HostStream), it runs once they have.
  virtual void afterCalls(c10::Stream /*stream*/, Settle settle) { settle(nullptr); }
  // Whether a task runs when its stream reaches it (the host's worker), rather than when it is
  // issued (CUDA, where it only enqueues kernels): then its running means the op has started.
  virtual bool tasksRunInStreamOrder() const { return true; }
  // Whether Event::block() holds the calling thread until the event passes (the host, whose
  // streams are threads), rather than ordering the caller's stream after it (CUDA).
  virtual bool joinBlocksCaller() const { return false; }
  // Issues `kernel` on the calling thread's current stream, as ATen issues its kernels. A
  // device whose streams are its threads runs it at once.
  virtual void launch(const Kernel& kernel, c10::ArrayRef<at::Tensor> outputs,
                      c10::ArrayRef<at::Tensor> inputs, int64_t scalar) {
    kernel.run(outputs, inputs, scalar);
  }
  // The devices an op's future must name so that then() callbacks, and a wait() on it, are
  // ordered after the op on the device's streams (c10::ivalue::Future records its events
  // there). None where the future's completion means the data is ready (the host).
  virtual std::vector<c10::Device> futureDevices() const { return {}; }
  // A future completed with `value` now, for an op that settled before it was asked for:
  // its device events (where futureDevices() names some) follow `end`, the op's end event,
  // and nothing issued after it, as if the op's task had completed it.
  virtual c10::intrusive_ptr<c10::ivalue::Future> completedFuture(Event& /*end*/,
                                                                  const c10::TypePtr& type,
                                                                  c10::IValue value) {
    auto future = c10::make_intrusive<c10::ivalue::Future>(type, futureDevices());
    future->markCompleted(std::move(value));
    return future;
  }
};

}  // namespace streamnccl
