#pragma once

// Every NCCL function the NCCL path calls, as one virtual each with NCCL's own parameters, so
// that the recording fake (csrc/fake/) can stand in for the library where there is no GPU.
// library() is the real NCCL: each function forwards to its namesake and nothing else (the
// caller makes the communicator's device current, as for CudaApi).

#include <c10/core/Device.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <memory>

// ncclCommShrink's flags (NCCL 2.27+), for headers older than that.
#ifndef NCCL_SHRINK_DEFAULT
#define NCCL_SHRINK_DEFAULT 0x00
#define NCCL_SHRINK_ABORT 0x01
#endif

namespace streamnccl {

class NcclApi {
 public:
  virtual ~NcclApi() = default;
  static std::shared_ptr<NcclApi> library();

  virtual ncclResult_t getVersion(int* version) = 0;
  virtual ncclResult_t getUniqueId(ncclUniqueId* id) = 0;
  // On the calling thread's current device, which becomes the communicator's.
  virtual ncclResult_t commInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                          ncclConfig_t* config) = 0;
  // On a non-blocking communicator: returns ncclInProgress, and ncclCommGetAsyncError says
  // ncclSuccess once the communicator's operations have completed on every member.
  // NCCL 2.27+ (the library looks it up at run time, so that an older NCCL still loads): a
  // communicator of `comm`'s members but the excluded, made collectively by them; with
  // NCCL_SHRINK_ABORT, `comm`'s operations in flight are ended first. Non-blocking as
  // `config` says, like init.
  virtual ncclResult_t commShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                                  ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags) = 0;
  // A communicator of the members of `comm` that pass the same `color`, ranked by `key`, made
  // collectively by every member of `comm` (NCCL_SPLIT_NOCOLOR: this one takes part but joins
  // none, and `*newcomm` stays null). On a non-blocking `comm`, as commShrink: `comm` reports
  // ncclInProgress, and NCCL's own thread writes `*newcomm` later, once made.
  virtual ncclResult_t commSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                 ncclConfig_t* config) = 0;
  virtual ncclResult_t commFinalize(ncclComm_t comm) = 0;
  virtual ncclResult_t commDestroy(ncclComm_t comm) = 0;
  virtual ncclResult_t commAbort(ncclComm_t comm) = 0;
  virtual ncclResult_t commGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) = 0;
  virtual const char* getErrorString(ncclResult_t result) = 0;
  virtual const char* getLastError(ncclComm_t comm) = 0;

  virtual ncclResult_t allReduce(const void* sendbuff, void* recvbuff, size_t count,
                                 ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                 cudaStream_t stream) = 0;
  virtual ncclResult_t broadcast(const void* sendbuff, void* recvbuff, size_t count,
                                 ncclDataType_t datatype, int root, ncclComm_t comm,
                                 cudaStream_t stream) = 0;
  virtual ncclResult_t reduce(const void* sendbuff, void* recvbuff, size_t count,
                              ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                              cudaStream_t stream) = 0;
  virtual ncclResult_t allGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                 ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) = 0;
  virtual ncclResult_t reduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                     ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                     cudaStream_t stream) = 0;
  // Whether the NCCL loaded has ncclAlltoAll (2.28+).
  virtual bool hasAllToAll() = 0;
  // NCCL 2.28+, looked up at run time as commShrink is: block r (`count` elements) of
  // `sendbuff` goes to rank r, and block r of `recvbuff` comes from rank r; not in place.
  virtual ncclResult_t allToAll(const void* sendbuff, void* recvbuff, size_t count,
                                ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) = 0;
  virtual ncclResult_t send(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                            ncclComm_t comm, cudaStream_t stream) = 0;
  virtual ncclResult_t recv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                            ncclComm_t comm, cudaStream_t stream) = 0;
  virtual ncclResult_t groupStart() = 0;
  virtual ncclResult_t groupEnd() = 0;
  virtual ncclResult_t redOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                            ncclScalarResidence_t residence, ncclComm_t comm) = 0;
  virtual ncclResult_t redOpDestroy(ncclRedOp_t op, ncclComm_t comm) = 0;

  // Memory NCCL can register, and its registration with a communicator (NCCL 2.19+, looked up
  // at run time as commShrink is): whether the NCCL loaded has all four functions below.
  virtual bool hasMemAlloc() = 0;
  // On the calling thread's current device.
  virtual ncclResult_t memAlloc(void** ptr, size_t size) = 0;
  // Memory still registered with a communicator must be deregistered first: NCCL keeps its
  // mappings of it until then.
  virtual ncclResult_t memFree(void* ptr) = 0;
  // Registers `size` bytes at `buff` with `comm`, so that its collectives use the memory in
  // place (NVLink SHARP, zero-copy). Not collective. Registering memory again hands out the
  // same handle, counted: each registration needs its deregistration. A null handle means
  // NCCL registers nothing (NCCL_LOCAL_REGISTER=0).
  virtual ncclResult_t commRegister(ncclComm_t comm, void* buff, size_t size, void** handle) = 0;
  // Ends one registration of `handle` on `comm`, the one it was made on. NCCL does not wait
  // for the communicator's kernels: none still queued may use the memory.
  virtual ncclResult_t commDeregister(ncclComm_t comm, void* handle) = 0;
};

}  // namespace streamnccl
