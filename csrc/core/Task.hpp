#pragma once

#include <functional>
#include <memory>
#include <type_traits>
#include <utility>

namespace streamnccl {

// A task handed to a device (Device::enqueue, Device::afterCalls): a reference to the caller's
// callable, which the device either runs at once or, where it must keep it for later (the
// host's stream, a lane still connecting), moves into a std::function of its own with take().
// On CUDA every op's task runs at once, so the launch path allocates nothing for it: a
// std::function would have copied the op's task to the heap.
//
// A task refers to its callable: it is used within the call it is passed to, and never kept
// (take() what must be kept).
template <typename... Args>
class BasicTask {
 public:
  // Implicit, as a lambda converts to a std::function.
  template <typename Callable,
            typename = std::enable_if_t<!std::is_same_v<std::decay_t<Callable>, BasicTask>>>
  BasicTask(Callable&& callable)  // NOLINT(google-explicit-constructor)
      : callable_(const_cast<void*>(static_cast<const void*>(std::addressof(callable)))),
        run_([](void* target, Args... args) {
          (*static_cast<std::remove_reference_t<Callable>*>(target))(args...);
        }),
        take_([](void* target) -> std::function<void(Args...)> {
          return std::move(*static_cast<std::remove_reference_t<Callable>*>(target));
        }) {}

  // Run now as `run`, which may borrow what it uses; kept as what `keep()` returns, which must
  // own it. For a task whose references would cost atomic counts at every launch on a device
  // that runs it at once (CUDA), where only a kept one needs them.
  template <typename Run, typename Keep>
  BasicTask(Run& run, Keep& keep)
      : callable_(&run),
        keep_(&keep),
        run_([](void* target, Args... args) { (*static_cast<Run*>(target))(args...); }),
        take_([](void* target) -> std::function<void(Args...)> {
          return (*static_cast<Keep*>(target))();
        }) {}

  void operator()(Args... args) const { run_(callable_, args...); }
  // The callable, moved into a std::function that may be kept; this task is spent.
  std::function<void(Args...)> take() && { return take_(keep_ ? keep_ : callable_); }

 private:
  void* callable_;
  void* keep_ = nullptr;
  void (*run_)(void*, Args...);
  std::function<void(Args...)> (*take_)(void*);
};

// An op's work on a stream (Device::enqueue).
using Task = BasicTask<>;
// What finishes an op once the communicator calls its task issued have completed, given the
// failure of the first that failed, or null (Device::afterCalls).
using Settle = BasicTask<std::exception_ptr>;

}  // namespace streamnccl
