#pragma once

#include <ATen/core/Tensor.h>

#include <initializer_list>
#include <utility>
#include <vector>

namespace streamnccl {

// The tensors an op names (Launch's inputs): a list of its own, or the caller's list borrowed
// for the call. Most ops' inputs are the caller's list as it is, and a sync op needs them only
// while it is launched (their shapes for the flight recorder, their sizes for the stats): a
// copy would cost every launch an allocation and a reference count per tensor. An async op
// takes() them, copied then, to hold until its end.
//
// Borrowed from an lvalue, owned from an rvalue; a borrowed list must outlive the launch.
class TensorList {
 public:
  TensorList(std::vector<at::Tensor>&& owned)  // NOLINT(google-explicit-constructor)
      : owned_(std::move(owned)), list_(&owned_) {}
  TensorList(const std::vector<at::Tensor>& borrowed)  // NOLINT(google-explicit-constructor)
      : list_(&borrowed) {}
  TensorList(std::initializer_list<at::Tensor> owned)  // NOLINT(google-explicit-constructor)
      : owned_(owned), list_(&owned_) {}
  TensorList(TensorList&& other) noexcept
      : owned_(std::move(other.owned_)), list_(other.owns() ? &owned_ : other.list_) {}
  TensorList(const TensorList&) = delete;
  TensorList& operator=(const TensorList&) = delete;
  TensorList& operator=(TensorList&&) = delete;

  const std::vector<at::Tensor>& get() const { return *list_; }
  // The list, as a vector of its own: moved out if owned, else copied.
  std::vector<at::Tensor> take() && { return owns() ? std::move(owned_) : *list_; }

 private:
  bool owns() const { return list_ == &owned_; }

  std::vector<at::Tensor> owned_;
  const std::vector<at::Tensor>* list_;
};

}  // namespace streamnccl
