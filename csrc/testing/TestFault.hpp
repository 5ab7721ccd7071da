#pragma once

// Fault injection for the tests (STREAMNCCL_TEST_FAULT, TestFault.cpp): a launch hook that
// streamnccl._testing adds to every group made after it is imported.

#include "core/hooks/Hooks.hpp"

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace streamnccl::testing {

// What STREAMNCCL_TEST_FAULT asks: op `op` of every group on group rank `rank` fails (`fail`),
// or is issued `delay` late.
struct TestFault {
  int rank = -1;
  uint64_t op = 0;
  bool fail = true;
  std::chrono::milliseconds delay{0};
};

// The variable's value parsed; raises ValueError naming what is wrong.
TestFault parseTestFault(const std::string& spec);

// The hook maker streamnccl._testing adds (hooks::addHookMaker): reads STREAMNCCL_TEST_FAULT as
// the group `view` is made; the hook where it names this rank, else none.
std::unique_ptr<LaunchHook> testFaultFromEnv(hooks::GroupView view);

}  // namespace streamnccl::testing
