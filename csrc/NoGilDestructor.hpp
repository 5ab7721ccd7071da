#pragma once

// The pybind11 holder of streamnccl's objects, shared by the product module (bindings.cpp) and
// the test doubles' module (testing/Bindings.cpp), which hands out groups of the same type.

#include <c10/util/intrusive_ptr.h>
#include <pybind11/pybind11.h>

namespace streamnccl {

// The Python holder of a ProcessGroup. It releases the GIL before dropping its reference:
// destroying a group joins its host worker, which may itself need the GIL to drop a tensor
// whose Python object it keeps alive, and would wait for it forever. Same layout as
// c10::intrusive_ptr, as torch's own c10d holders.
template <typename T>
class NoGilDestructor {
 public:
  NoGilDestructor() = default;
  explicit NoGilDestructor(T* raw) : ptr_(c10::intrusive_ptr<T>::reclaim_copy(raw)) {}
  NoGilDestructor(c10::intrusive_ptr<T> ptr) : ptr_(std::move(ptr)) {}  // NOLINT: implicit
  NoGilDestructor(const NoGilDestructor&) = default;
  NoGilDestructor& operator=(const NoGilDestructor&) = default;
  ~NoGilDestructor() {
    if (ptr_ && PyGILState_Check()) {
      pybind11::gil_scoped_release noGil;
      ptr_.reset();
    }
  }
  T* get() const { return ptr_.get(); }
  operator c10::intrusive_ptr<T>() const { return ptr_; }  // NOLINT: implicit

 private:
  c10::intrusive_ptr<T> ptr_;
};

}  // namespace streamnccl

PYBIND11_DECLARE_HOLDER_TYPE(T, streamnccl::NoGilDestructor<T>, true);
