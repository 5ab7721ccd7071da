// NcclApi::library(): the real NCCL, one call per function.

#include "cuda/NcclApi.hpp"

#include <dlfcn.h>

namespace streamnccl {
namespace {

// `name` in the NCCL this extension loaded (the library holding ncclGetVersion), or null.
void* ncclSymbol(const char* name) {
  Dl_info library{};
  if (dladdr(reinterpret_cast<void*>(&ncclGetVersion), &library) == 0 ||
      library.dli_fname == nullptr) {
    return nullptr;
  }
  void* handle = dlopen(library.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
  return handle == nullptr ? nullptr : dlsym(handle, name);
}

class NcclLibrary final : public NcclApi {
 public:
  ncclResult_t getVersion(int* version) override { return ncclGetVersion(version); }
  ncclResult_t getUniqueId(ncclUniqueId* id) override { return ncclGetUniqueId(id); }
  ncclResult_t commInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                  ncclConfig_t* config) override {
    return ncclCommInitRankConfig(comm, nranks, id, rank, config);
  }
  ncclResult_t commShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                          ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags) override {
    // Looked up, not linked: a reference to it would keep the extension from loading at all
    // with an NCCL older than 2.27, which has none.
    using Shrink = ncclResult_t (*)(ncclComm_t, int*, int, ncclComm_t*, ncclConfig_t*, int);
    static const auto shrink = reinterpret_cast<Shrink>(ncclSymbol("ncclCommShrink"));
    if (shrink == nullptr) {
      return ncclInvalidUsage;  // the caller checked the version first and says why
    }
    return shrink(comm, excludeRanksList, excludeRanksCount, newcomm, config, shrinkFlags);
  }
  ncclResult_t commSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                         ncclConfig_t* config) override {
    return ncclCommSplit(comm, color, key, newcomm, config);
  }
  ncclResult_t commFinalize(ncclComm_t comm) override { return ncclCommFinalize(comm); }
  ncclResult_t commDestroy(ncclComm_t comm) override { return ncclCommDestroy(comm); }
  ncclResult_t commAbort(ncclComm_t comm) override { return ncclCommAbort(comm); }
  ncclResult_t commGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) override {
    return ncclCommGetAsyncError(comm, asyncError);
  }
  const char* getErrorString(ncclResult_t result) override { return ncclGetErrorString(result); }
  const char* getLastError(ncclComm_t comm) override { return ncclGetLastError(comm); }

  ncclResult_t allReduce(const void* sendbuff, void* recvbuff, size_t count,
                         ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                         cudaStream_t stream) override {
    return ncclAllReduce(sendbuff, recvbuff, count, datatype, op, comm, stream);
  }
  ncclResult_t broadcast(const void* sendbuff, void* recvbuff, size_t count,
                         ncclDataType_t datatype, int root, ncclComm_t comm,
                         cudaStream_t stream) override {
    return ncclBroadcast(sendbuff, recvbuff, count, datatype, root, comm, stream);
  }
  ncclResult_t reduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                      ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) override {
    return ncclReduce(sendbuff, recvbuff, count, datatype, op, root, comm, stream);
  }
  ncclResult_t allGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                         ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) override {
    return ncclAllGather(sendbuff, recvbuff, sendcount, datatype, comm, stream);
  }
  ncclResult_t reduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                             ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                             cudaStream_t stream) override {
    return ncclReduceScatter(sendbuff, recvbuff, recvcount, datatype, op, comm, stream);
  }
  bool hasAllToAll() override { return allToAllSymbol() != nullptr; }
  ncclResult_t allToAll(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                        ncclComm_t comm, cudaStream_t stream) override {
    const auto allToAll = allToAllSymbol();
    if (allToAll == nullptr) {
      return ncclInvalidUsage;  // the caller asked hasAllToAll() first
    }
    return allToAll(sendbuff, recvbuff, count, datatype, comm, stream);
  }
  ncclResult_t send(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                    ncclComm_t comm, cudaStream_t stream) override {
    return ncclSend(sendbuff, count, datatype, peer, comm, stream);
  }
  ncclResult_t recv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                    ncclComm_t comm, cudaStream_t stream) override {
    return ncclRecv(recvbuff, count, datatype, peer, comm, stream);
  }
  ncclResult_t groupStart() override { return ncclGroupStart(); }
  ncclResult_t groupEnd() override { return ncclGroupEnd(); }
  ncclResult_t redOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                    ncclScalarResidence_t residence, ncclComm_t comm) override {
    return ncclRedOpCreatePreMulSum(op, scalar, datatype, residence, comm);
  }
  ncclResult_t redOpDestroy(ncclRedOp_t op, ncclComm_t comm) override {
    return ncclRedOpDestroy(op, comm);
  }
  bool hasMemAlloc() override { return memory().present(); }
  ncclResult_t memAlloc(void** ptr, size_t size) override {
    return memory().alloc ? memory().alloc(ptr, size) : ncclInvalidUsage;
  }
  ncclResult_t memFree(void* ptr) override {
    return memory().free ? memory().free(ptr) : ncclInvalidUsage;
  }
  ncclResult_t commRegister(ncclComm_t comm, void* buff, size_t size, void** handle) override {
    return memory().reg ? memory().reg(comm, buff, size, handle) : ncclInvalidUsage;
  }
  ncclResult_t commDeregister(ncclComm_t comm, void* handle) override {
    return memory().dereg ? memory().dereg(comm, handle) : ncclInvalidUsage;
  }

 private:
  // Looked up, not linked, as ncclCommShrink: NCCL before 2.28 has none.
  using AllToAll = ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclComm_t,
                                    cudaStream_t);
  static AllToAll allToAllSymbol() {
    static const auto allToAll = reinterpret_cast<AllToAll>(ncclSymbol("ncclAlltoAll"));
    return allToAll;
  }
  // Looked up, not linked, as ncclCommShrink: NCCL before 2.19 has none of them. A caller asks
  // hasMemAlloc() first; the calls fail with ncclInvalidUsage otherwise.
  struct Memory {
    ncclResult_t (*alloc)(void**, size_t) = nullptr;
    ncclResult_t (*free)(void*) = nullptr;
    ncclResult_t (*reg)(ncclComm_t, void*, size_t, void**) = nullptr;
    ncclResult_t (*dereg)(ncclComm_t, void*) = nullptr;
    bool present() const { return alloc && free && reg && dereg; }
  };
  static const Memory& memory() {
    static const Memory functions = [] {
      Memory found;
      found.alloc = reinterpret_cast<decltype(found.alloc)>(ncclSymbol("ncclMemAlloc"));
      found.free = reinterpret_cast<decltype(found.free)>(ncclSymbol("ncclMemFree"));
      found.reg = reinterpret_cast<decltype(found.reg)>(ncclSymbol("ncclCommRegister"));
      found.dereg = reinterpret_cast<decltype(found.dereg)>(ncclSymbol("ncclCommDeregister"));
      return found;
    }();
    return functions;
  }
};

}  // namespace

std::shared_ptr<NcclApi> NcclApi::library() {
  static const auto library = std::make_shared<NcclLibrary>();
  return library;
}

}  // namespace streamnccl
