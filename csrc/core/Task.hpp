#pragma once

#include <functional>
#include <memory>
#include <type_traits>
#include <utility>

namespace streamnccl {

// A task handed to a device (Device::enqueue): a reference to the caller's callable, which the
// device either runs at once or, where it must keep it for later (the host's worker, a lane
// still connecting), moves into a std::function of its own with take(). On CUDA every op's
// task runs at once, so the launch path allocates nothing for it: a std::function would have
// copied the op's task to the heap.
//
// A Task refers to its callable: it is used within the enqueue() call it is passed to, and
// never kept (take() what must be kept).
class Task {
 public:
  // Implicit, as a lambda converts to a std::function.
  template <typename Callable,
            typename = std::enable_if_t<!std::is_same_v<std::decay_t<Callable>, Task>>>
  Task(Callable&& callable)  // NOLINT(google-explicit-constructor)
      : callable_(const_cast<void*>(static_cast<const void*>(std::addressof(callable)))),
        run_([](void* target) { (*static_cast<std::remove_reference_t<Callable>*>(target))(); }),
        take_([](void* target) -> std::function<void()> {
          return std::move(*static_cast<std::remove_reference_t<Callable>*>(target));
        }) {}

  // Run now as `run`, which may borrow what it uses; kept as what `keep()` returns, which must
  // own it. For a task whose references would cost atomic counts at every launch on a device
  // that runs it at once (CUDA), where only a kept one needs them.
  template <typename Run, typename Keep>
  Task(Run& run, Keep& keep)
      : callable_(&run),
        keep_(&keep),
        run_([](void* target) { (*static_cast<Run*>(target))(); }),
        take_([](void* target) -> std::function<void()> {
          return (*static_cast<Keep*>(target))();
        }) {}

  void operator()() const { run_(callable_); }
  // The callable, moved into a std::function that may be kept; this Task is spent.
  std::function<void()> take() && { return take_(keep_ ? keep_ : callable_); }

 private:
  void* callable_;
  void* keep_ = nullptr;
  void (*run_)(void*);
  std::function<void()> (*take_)(void*);
};

}  // namespace streamnccl
