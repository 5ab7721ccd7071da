#pragma once

// Every group made in this process, held weakly: what the process's exit shuts down
// (ProcessGroup::shutdownAll) and what a dump of the flight recorder asks to count ended ops
// as ended. Weakly, so that walking it keeps each group alive by a reference of its own: a
// group whose last other reference goes meanwhile (in an op's callback, on one of its own
// threads) is torn down after the walk, and never waits for the walker, which may be waiting
// for that very callback.

#include <c10/util/intrusive_ptr.h>

#include <cstdint>
#include <vector>

namespace streamnccl {

class ProcessGroup;

namespace groupRegistry {

// `uid`: the group's place in the order groups were made, which every rank shares.
void add(const c10::intrusive_ptr<ProcessGroup>& group, int64_t uid);
// The group's last reference went, and its teardown was done or handed to a thread of its own.
void remove(const ProcessGroup* group);
// References to the groups alive now, in the order they were made. With `afterTheDying`,
// first waits until every group whose last reference went meanwhile has been removed.
std::vector<c10::intrusive_ptr<ProcessGroup>> alive(bool afterTheDying = false);

}  // namespace groupRegistry
}  // namespace streamnccl
