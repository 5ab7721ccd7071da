#pragma once

// Waiting for keys of a c10d::Store in a way that can be stopped, and that times out alike on
// every kind of Store.

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace streamnccl {

// Whether every one of `keys` is set within `timeout`, asking `stop` (which throws to stop
// waiting, e.g. where the caller's group broke) between looks. Asked with check(), which every
// Store answers at once: their wait()s cannot be stopped, and time out with errors of
// different kinds (a FileStore's a plain one).
bool keysSetWithin(c10d::Store& store, const std::vector<std::string>& keys,
                   std::chrono::milliseconds timeout, const std::function<void()>& stop);

}  // namespace streamnccl
