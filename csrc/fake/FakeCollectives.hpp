#pragma once

// Test-only. What the fake NCCL kernels do to memory when they run: each member's operation,
// given the matching operations of the others (or, where the world simulates its peers,
// mirrors of this member's own), computed on views of the buffers as NCCL would.

#include "fake/FakeStreamItem.hpp"

#include <vector>

namespace streamnccl::fake {

// One collective: `ops[r]` is member r's operation (all of one kind, one index).
void runCollective(const std::vector<const NcclOp*>& ops);
// A collective whose peers are mirrors of member `rank` of `nranks`: every member's send
// buffer holds what this one's does.
void runMirroredCollective(const NcclOp& op, int rank, int nranks);
// A message: the send's buffer into the recv's.
void runMessage(const NcclOp& send, const NcclOp& recv);

at::ScalarType scalarTypeOf(ncclDataType_t type);

}  // namespace streamnccl::fake
