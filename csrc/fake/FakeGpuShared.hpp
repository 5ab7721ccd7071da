#pragma once

// Test-only. What the files of FakeGpu share; not for use outside csrc/fake/FakeGpu*.cpp.

#include <mutex>
#include <string>

namespace streamnccl::fake::detail {

// Everything a fake GPU does happens under its world's lock (FakeNcclWorld::mutex).
using Lock = std::lock_guard<std::recursive_mutex>;

inline std::string deviceName(int index) { return "cuda:" + std::to_string(index); }

}  // namespace streamnccl::fake::detail
