#pragma once

// The one way streamnccl polls: most waits are short, so the first pause is short, and each
// pause after it doubles up to a cap, so that a long wait costs a few wake-ups a cap apart.

#include <algorithm>
#include <chrono>
#include <thread>

namespace streamnccl {

class Backoff {
 public:
  using Pause = std::chrono::microseconds;

  Backoff(Pause first, Pause cap) : first_(first), cap_(cap), next_(first) {}

  // Sleeps for the next pause, then doubles it up to the cap.
  void pause() {
    std::this_thread::sleep_for(next_);
    next_ = std::min(next_ * 2, cap_);
  }

  // After progress: the next pause is the first again.
  void reset() { next_ = first_; }

 private:
  Pause first_;
  Pause cap_;
  Pause next_;
};

}  // namespace streamnccl
