#pragma once

// Every group made in this process (streamnccl's ProcessGroups, known here as the c10d::Backend
// they are, so that the registry sits below them), held weakly: what the process's exit shuts down
// (ProcessGroup::shutdownAll) and whose watchdogs a dump of the flight recorder asks to count
// ended ops as ended. Weakly, so that the exit walks it with references of its own: a group
// whose last other reference goes meanwhile (in an op's callback, on one of its own threads)
// is torn down after the walk, and never waits for the walker, which may be waiting for that
// very callback.

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <cstdint>
#include <memory>
#include <vector>

namespace streamnccl {

class Watchdog;

namespace groupRegistry {

// `uid`: the group's place in the order groups were made, which every rank shares.
void add(const c10::intrusive_ptr<c10d::Backend>& group, int64_t uid,
         const std::shared_ptr<Watchdog>& watchdog);
// The group's last reference went, and its teardown was done or handed to a thread of its own.
void remove(const c10d::Backend* group);
// References to the groups alive now, in the order they were made.
std::vector<c10::intrusive_ptr<c10d::Backend>> alive();
// Returns once every group whose last reference has gone is removed.
void waitForTheDying();
// The watchdogs of the groups in the registry (alive, or still tearing down): no reference to
// a group, whose last one, let go of here, would tear the group down on the caller's thread.
std::vector<std::shared_ptr<Watchdog>> watchdogs();

}  // namespace groupRegistry
}  // namespace streamnccl
