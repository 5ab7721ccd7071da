#include "fake/NoOpDevice.hpp"

#include <cstring>

namespace streamnccl::fake {
namespace {

// The calling thread's current stream, as c10 keeps one per thread; 0 is the default stream.
thread_local c10::StreamId currentStreamId = 0;

}  // namespace

c10::Stream NoOpCuda::currentStream(const c10::Device& device) {
  return c10::Stream(c10::Stream::UNSAFE, device, currentStreamId);
}

c10::Stream NoOpCuda::exchangeCurrentStream(c10::Stream stream) {
  const c10::StreamId previous = std::exchange(currentStreamId, stream.id());
  return c10::Stream(c10::Stream::UNSAFE, stream.device(), previous);
}

ncclResult_t NoOpNccl::getVersion(int* version) {
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t NoOpNccl::getUniqueId(ncclUniqueId* id) {
  std::memset(id, 0, sizeof(*id));
  return ncclSuccess;
}

ncclResult_t NoOpNccl::commInitRankConfig(ncclComm_t* comm, int, ncclUniqueId, int, ncclConfig_t*) {
  *comm = reinterpret_cast<ncclComm_t>(++comms_);
  return ncclSuccess;
}

ncclResult_t NoOpNccl::commShrink(ncclComm_t, int*, int, ncclComm_t* newcomm, ncclConfig_t*, int) {
  *newcomm = reinterpret_cast<ncclComm_t>(++comms_);
  return ncclSuccess;
}

ncclResult_t NoOpNccl::commSplit(ncclComm_t, int, int, ncclComm_t* newcomm, ncclConfig_t*) {
  *newcomm = reinterpret_cast<ncclComm_t>(++comms_);
  return ncclSuccess;
}

ncclResult_t NoOpNccl::commGetAsyncError(ncclComm_t, ncclResult_t* asyncError) {
  *asyncError = ncclSuccess;
  return ncclSuccess;
}

ncclResult_t NoOpNccl::redOpCreatePreMulSum(ncclRedOp_t* op, void*, ncclDataType_t,
                                            ncclScalarResidence_t, ncclComm_t) {
  *op = static_cast<ncclRedOp_t>(ncclNumOps);
  return ncclSuccess;
}

}  // namespace streamnccl::fake
