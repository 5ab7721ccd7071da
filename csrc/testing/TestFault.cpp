// STREAMNCCL_TEST_FAULT="rank=R,op=N,action=fail" or "...,action=delay,ms=M": op number N
// (counted from 1) of every group made on rank R fails with a DistBackendError as it is issued,
// or is issued M ms late, so that the tests make a fault happen where they want. A launch hook
// of the test doubles: importing streamnccl._testing adds its maker (Hooks.hpp's seam), which
// reads the variable as each group is made and registers the hook on the rank it names alone.

#include "testing/TestFault.hpp"

#include "core/Errors.hpp"

#include <charconv>
#include <cstdlib>
#include <sstream>
#include <thread>

namespace streamnccl::testing {
namespace {

class TestFaultHook final : public LaunchHook {
 public:
  explicit TestFaultHook(TestFault fault) : fault_(fault) {}

  std::shared_ptr<void> launched(LaunchedOp& op) override {
    if (op.info.seq != fault_.op) {
      return nullptr;
    }
    if (fault_.fail) {
      op.steps.issue = [](Transport&, Kernels&, c10::Stream) {
        throwDistBackendError("injected fault (STREAMNCCL_TEST_FAULT)");
      };
    } else {
      op.steps.issue = [issue = std::move(op.steps.issue), delay = fault_.delay](
                           Transport& comm, Kernels& kernels, c10::Stream stream) {
        std::this_thread::sleep_for(delay);
        issue(comm, kernels, stream);
      };
    }
    return nullptr;
  }

 private:
  const TestFault fault_;
};

int64_t nonNegative(const std::string& key, const std::string& value) {
  int64_t number = -1;
  const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), number);
  TORCH_CHECK_VALUE(error == std::errc() && end == value.data() + value.size() && number >= 0,
                    "streamnccl: STREAMNCCL_TEST_FAULT ", key, "='", value,
                    "' is not a non-negative integer");
  return number;
}

}  // namespace

TestFault parseTestFault(const std::string& spec) {
  TestFault fault;
  std::string action = "fail";
  std::istringstream fields(spec);
  std::string field;
  while (std::getline(fields, field, ',')) {
    const auto equals = field.find('=');
    TORCH_CHECK_VALUE(equals != std::string::npos, "streamnccl: STREAMNCCL_TEST_FAULT field '",
                      field, "' is not key=value");
    const std::string key = field.substr(0, equals);
    const std::string value = field.substr(equals + 1);
    if (key == "rank") {
      fault.rank = static_cast<int>(nonNegative(key, value));
    } else if (key == "op") {
      fault.op = static_cast<uint64_t>(nonNegative(key, value));
    } else if (key == "action") {
      action = value;
    } else if (key == "ms") {
      fault.delay = std::chrono::milliseconds(nonNegative(key, value));
    } else {
      TORCH_CHECK_VALUE(false, "streamnccl: STREAMNCCL_TEST_FAULT has an unknown key '", key,
                        "' (expected rank, op, action, ms)");
    }
  }
  TORCH_CHECK_VALUE(action == "fail" || action == "delay", "streamnccl: STREAMNCCL_TEST_FAULT ",
                    "action is '", action, "', expected fail or delay");
  TORCH_CHECK_VALUE(fault.rank >= 0 && fault.op > 0, "streamnccl: STREAMNCCL_TEST_FAULT='", spec,
                    "' needs rank=R and op=N (from 1)");
  fault.fail = action == "fail";
  return fault;
}

std::unique_ptr<LaunchHook> testFaultFromEnv(hooks::GroupView view) {
  const char* spec = std::getenv("STREAMNCCL_TEST_FAULT");
  if (spec == nullptr || *spec == '\0') {
    return nullptr;
  }
  const TestFault fault = parseTestFault(spec);  // a malformed one is refused as the group is made
  if (fault.rank != view.group.getRank()) {
    return nullptr;
  }
  return std::make_unique<TestFaultHook>(fault);
}

}  // namespace streamnccl::testing
