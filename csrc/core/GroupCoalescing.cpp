// Coalescing: between startCoalescing() and endCoalescing() (torch's _coalescing_manager,
// batch_isend_irecv, the *_coalesced ops), a group's ops are recorded instead of launched, and
// launched at the end as one communicator group on the internal stream, with one Work.

#include "core/Errors.hpp"
#include "core/ProcessGroup.hpp"

namespace streamnccl {

c10::intrusive_ptr<c10d::Work> ProcessGroup::submit(Launch launch, Path& path, Steps steps) {
  if (!coalescing_) {
    return this->launch(std::move(launch), path, std::move(steps));
  }
  Coalesced& group = *coalescing_;
  if (group.path == nullptr) {
    group.path = &path;
    group.future = Launcher::makeFuture(*path.device);
  }
  STREAMNCCL_CHECK_ARG(group.path == &path, launch.op, "tensors on ", path.device->device(),
                       " cannot join a coalesced group on ", group.path->device->device(),
                       "; one group runs on one device");
  group.steps.push_back(std::move(steps));
  group.inputs.insert(group.inputs.end(), launch.inputs.get().begin(), launch.inputs.get().end());
  group.outputs.insert(group.outputs.end(), launch.outputs.begin(), launch.outputs.end());
  // The group's future: waiting on it waits for the whole group, once it has been ended.
  return c10d::Work::create_from_future(group.future);
}

void ProcessGroup::startCoalescing() {
  TORCH_CHECK_VALUE(!coalescing_,
                    "streamnccl startCoalescing: already coalescing; "
                    "end the open group with endCoalescing() first");
  coalescing_.emplace();
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::endCoalescing() {
  TORCH_CHECK_VALUE(coalescing_,
                    "streamnccl endCoalescing: no group was started "
                    "(call startCoalescing() first)");
  Coalesced group = std::move(*coalescing_);
  coalescing_.reset();
  if (group.steps.empty()) {
    auto done = c10::make_intrusive<c10::ivalue::Future>(tensorListType());
    done->markCompleted(c10::IValue(std::vector<at::Tensor>{}));
    return c10d::Work::create_from_future(done);
  }
  const at::Tensor shapeOf = group.inputs.empty() ? group.outputs.front() : group.inputs.front();
  Steps combined{[steps = group.steps](Transport& comm, Kernels& kernels, c10::Stream stream) {
                   CommunicatorGroup group(comm);
                   for (const auto& step : steps) {
                     step.issue(comm, kernels, stream);
                   }
                   group.end();
                 },
                 [steps = group.steps](Kernels& kernels) {
                   for (const auto& step : steps) {
                     if (step.finish) {
                       step.finish(kernels);
                     }
                   }
                 }};
  try {
    return launch({"coalesced", c10d::OpType::COALESCED, shapeOf, std::move(group.inputs),
                   std::move(group.outputs), /*async=*/true, c10d::kUnsetTimeout},
                  *group.path, std::move(combined), group.future);
  } catch (...) {
    // Refused before it was issued (the group broken, the ranks' ops found to differ): the
    // Works its ops handed out wait on this future, and must not wait for ever.
    group.future->setErrorIfNeeded(std::current_exception());
    throw;
  }
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::coalesce(const std::function<void()>& record) {
  const bool outer = !coalescing_;
  if (outer) {
    startCoalescing();
  }
  try {
    record();
  } catch (...) {
    if (outer) {
      coalescing_.reset();
    }
    throw;
  }
  if (outer) {
    return endCoalescing();
  }
  return c10d::Work::create_from_future(coalescing_->future);
}

}  // namespace streamnccl
