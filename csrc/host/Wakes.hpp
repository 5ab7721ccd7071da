#pragma once

#include "core/Errors.hpp"

#include <c10/util/Exception.h>

#include <functional>
#include <utility>
#include <vector>

namespace streamnccl {

// The wakes of waiters (an op's future completed, a host event's point passed) that a thread
// makes while it drives a host stream, made once it has let go of the stream, in the order
// they came. A waiter woken while the waking thread goes on is moved by the scheduler to an
// idle CPU, and waking an idle CPU costs far more than the wake (docs/performance.md); a
// thread that wakes as its last act hands its CPU over, as Gloo's thread does for a waiter of
// gloo's. Elsewhere, and while the wakes are being made, a wake is made at once.
//
// Opened by HostStream around its driving (Wakes wakes; before the lock, so that the outermost
// makes them once the lock is released); nested ones add to the outermost.
class Wakes {
 public:
  Wakes() : outermost_(!open()) { open() = true; }
  ~Wakes() {
    if (outermost_) {
      makeHeld();
      open() = false;
    }
  }
  Wakes(const Wakes&) = delete;
  Wakes& operator=(const Wakes&) = delete;

  // The outermost makes the wakes held so far, and holds later ones again.
  void deliver() {
    if (outermost_) {
      makeHeld();
    }
  }

  // Made at the outermost Wakes' end on this thread, or at once where none is open.
  static void make(std::function<void()> wake) {
    if (open()) {
      held().push_back(std::move(wake));
    } else {
      wake();
    }
  }

  // Makes the wakes held on this thread now: before work that may wait (the stream's next
  // item), which must not hold back an earlier op's waiters.
  static void makeHeld() {
    if (held().empty()) {
      return;
    }
    open() = false;  // a wake that issues work (a future's callback) is not held back
    while (!held().empty()) {
      for (auto& wake : std::exchange(held(), {})) {
        try {
          wake();
        } catch (...) {
          TORCH_WARN("streamnccl: a future callback or an event's waiter failed: ",
                     describeException(std::current_exception()));
        }
      }
    }
    open() = true;
  }

 private:
  static bool& open() {
    static thread_local bool open = false;
    return open;
  }
  static std::vector<std::function<void()>>& held() {
    static thread_local std::vector<std::function<void()>> held;
    return held;
  }

  const bool outermost_;
};

}  // namespace streamnccl
