// Memory for NCCL: the allocator of ncclMemAlloc's memory a group hands out (getMemAllocator,
// allocateTensor), and the registration of memory with a communicator (ncclCommRegister).
//
// On CUDA the allocator is torch's pluggable CUDA allocator over ncclMemAlloc and ncclMemFree,
// so that torch.cuda.MemPool can take it, as it takes ProcessGroupNCCL's. Over the fake GPU the
// NCCL path's tensors are CPU tensors: the allocator hands out CPU-typed memory from the fake's
// ncclMemAlloc, freed through its ncclMemFree.

#include "cuda/CudaPath.hpp"
#include "cuda/NcclCommunicator.hpp"

#include <c10/util/Exception.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <cstring>

namespace streamnccl {
namespace {

// ncclMemAlloc on `device` (made current for it, as ncclMemAlloc allocates on the current one).
void* allocateOn(NcclApi& nccl, CudaApi& cuda, const c10::Device& device, size_t bytes) {
  if (bytes == 0) {
    return nullptr;
  }
  auto scope = cuda.useDevice(device);
  void* ptr = nullptr;
  const ncclResult_t result = nccl.memAlloc(&ptr, bytes);
  TORCH_CHECK(result == ncclSuccess, "streamnccl: ncclMemAlloc of ", bytes, " bytes on ", device,
              " failed: ", nccl.getErrorString(result));
  return ptr;
}

// ncclMemFree, from a deleter, which must not throw.
void freeOn(NcclApi& nccl, CudaApi& cuda, const c10::Device& device, void* ptr) {
  if (ptr == nullptr) {
    return;
  }
  auto scope = cuda.useDevice(device);
  if (const ncclResult_t result = nccl.memFree(ptr); result != ncclSuccess) {
    TORCH_WARN("streamnccl: ncclMemFree of ", ptr, " on ", device,
               " failed: ", nccl.getErrorString(result));
  }
}

// The fake GPU's: tensors of the fake's type (CPU), their memory from its ncclMemAlloc.
class HostTypedNcclAllocator final : public c10::Allocator {
 public:
  HostTypedNcclAllocator(std::shared_ptr<NcclApi> nccl, std::shared_ptr<CudaApi> cuda)
      : nccl_(std::move(nccl)), cuda_(std::move(cuda)), device_(cuda_->tensorsType()) {}

  c10::DataPtr allocate(size_t bytes) override {
    void* ptr = allocateOn(*nccl_, *cuda_, device_, bytes);
    if (ptr == nullptr) {
      return {nullptr, device_};
    }
    // The deleter's context keeps the library alive as long as its memory is.
    auto* held = new Held{nccl_, cuda_, device_, ptr};
    return {ptr, held, &Held::release, device_};
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }

 private:
  struct Held {
    std::shared_ptr<NcclApi> nccl;
    std::shared_ptr<CudaApi> cuda;
    c10::Device device;
    void* ptr;
    static void release(void* context) {
      std::unique_ptr<Held> held(static_cast<Held*>(context));
      freeOn(*held->nccl, *held->cuda, held->device, held->ptr);
    }
  };
  const std::shared_ptr<NcclApi> nccl_;
  const std::shared_ptr<CudaApi> cuda_;
  const c10::Device device_;
};

std::shared_ptr<c10::Allocator> makeAllocator(std::shared_ptr<NcclApi> nccl,
                                              std::shared_ptr<CudaApi> cuda) {
  if (cuda->tensorsType() != c10::kCUDA) {
    return std::make_shared<HostTypedNcclAllocator>(std::move(nccl), std::move(cuda));
  }
  // torch's CUDA allocator interface, which torch.cuda.MemPool needs; the functions keep the
  // library alive as long as the allocator is.
  return torch::cuda::CUDAPluggableAllocator::createCustomAllocator(
      [nccl, cuda](size_t bytes, int device, cudaStream_t /*stream*/) {
        return allocateOn(*nccl, *cuda, c10::Device(c10::kCUDA, device), bytes);
      },
      [nccl, cuda](void* ptr, size_t /*bytes*/, int device, cudaStream_t /*stream*/) {
        freeOn(*nccl, *cuda, c10::Device(c10::kCUDA, device), ptr);
      });
}

}  // namespace

std::string CudaPathFactory::whyNoMemAllocator() {
  if (auto why = whyNoDevice()) {
    return *why;
  }
  if (!nccl_->hasMemAlloc()) {
    return "the NCCL loaded has no ncclMemAlloc and ncclCommRegister (NCCL 2.19+)";
  }
  return {};
}

std::shared_ptr<c10::Allocator> CudaPathFactory::memAllocator() {
  if (!whyNoMemAllocator().empty()) {
    return nullptr;
  }
  std::call_once(allocatorMade_, [&] { allocator_ = makeAllocator(nccl_, cuda_); });
  return allocator_;
}

bool CudaPathFactory::supportsTensorAlloc(c10::DeviceIndex index) {
  if (!whyNoMemAllocator().empty()) {
    return false;
  }
  try {
    cuda_->checkUsable(c10::Device(cuda_->tensorsType(), index));
    return true;
  } catch (const c10::Error&) {
    return false;
  }
}

void NcclCommunicator::registerMemory(void* address, size_t bytes, const std::string& who) {
  std::lock_guard<std::mutex> lock(registrationsMutex_);
  TORCH_CHECK_VALUE(registrations_.count(address) == 0, who, " register_mem_pool: the memory at ",
                    address, " is registered with this group's communicator already");
  TORCH_CHECK(nccl_->hasMemAlloc(), who,
              " register_mem_pool: the NCCL loaded has no ncclCommRegister (NCCL 2.19+)");
  auto scope = cuda_->useDevice(device_);
  auto use = connection_->use("ncclCommRegister");
  void* handle = nullptr;
  use.check("ncclCommRegister", nccl_->commRegister(use.comm(), address, bytes, &handle));
  registrations_.emplace(address, handle);
}

void NcclCommunicator::deregisterMemory(void* address, const std::string& who) {
  std::lock_guard<std::mutex> lock(registrationsMutex_);
  auto found = registrations_.find(address);
  TORCH_CHECK_VALUE(found != registrations_.end(), who, " deregister_mem_pool: the memory at ",
                    address, " is not registered with this group's communicator");
  auto scope = cuda_->useDevice(device_);
  auto use = connection_->use("ncclCommDeregister");
  // Forgotten whatever NCCL says: a failed deregistration is not retried with the same handle.
  void* handle = found->second;
  registrations_.erase(found);
  use.check("ncclCommDeregister", nccl_->commDeregister(use.comm(), handle));
}

}  // namespace streamnccl
