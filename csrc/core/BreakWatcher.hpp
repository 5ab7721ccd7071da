#pragma once

// The one thread per process that looks at the break boards (BreakBoard.hpp) of the process's
// groups, every kPeriod, and hands a break another rank posted to its group. Started by the
// first board; stopped at the process's exit (ProcessGroup::shutdownAll). A look that meets a
// slow Store holds up the other boards' looks, never a group's ops or its watchdog.

#include "core/BreakBoard.hpp"

#include <chrono>
#include <memory>

namespace streamnccl::breakWatcher {

inline constexpr std::chrono::milliseconds kPeriod{200};

// Looks at `board` until it is let go of (held weakly).
void watch(const std::shared_ptr<BreakBoard>& board);
// Ends the thread (at exit); a later watch() starts it again.
void stop();

}  // namespace streamnccl::breakWatcher
