#pragma once

// The end of a group (ProcessGroup::shutdown(), and its destruction): the ops in flight are
// finished first, up to the group's timeout, then the communicators closed in order; a broken
// group, or ops still unfinished at the timeout, abort them instead. Then each device finishes
// what its streams hold, and the group's threads end.
//
// It needs nothing of the group object, so that it can outlive it: a group let go of, or shut
// down, on one of its own threads (an op's future callback, see GroupThreads.hpp) ends on a
// thread of its own, which waits for that thread rather than the other way round.

#include "core/GroupHealth.hpp"
#include "core/OpInfo.hpp"
#include "core/Watchdog.hpp"

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace streamnccl {

struct GroupTeardown {
  OpInfo group;  // how messages name the group
  std::chrono::milliseconds timeout;
  std::shared_ptr<Watchdog> watchdog;
  std::shared_ptr<GroupHealth> health;
  bool shrunk = false;  // shrink_group() left some ranks out: they take no part in finalizing
  // The group's paths and lanes (devices, internal streams, communicators), in the order they
  // are let go of once every communicator is closed.
  std::vector<std::shared_ptr<void>> paths;

  void run();
};

// Counts a teardown apart ahead of runApart(..., reserved=true), or gives the count back.
void reserveTeardownApart();
void unreserveTeardownApart();
// Runs `teardown` on a thread of its own; waitForTeardownsApart() waits for it.
void runApart(GroupTeardown teardown, bool reserved = false);
// Returns once every teardown runApart() started has ended (at exit).
void waitForTeardownsApart();

}  // namespace streamnccl
