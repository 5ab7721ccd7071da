// The Python module streamnccl._C: binds Options and ProcessGroup, and is the one place that
// knows both the core and the concrete paths (host always, NCCL when compiled).

#include "NoGilDestructor.hpp"
#include "core/FlightRecorder.hpp"
#include "core/Options.hpp"
#include "core/ProcessGroup.hpp"
#include "core/StoreKeys.hpp"
#include "host/HostPath.hpp"

#ifdef STREAMNCCL_WITH_NCCL
#include "cuda/CudaPath.hpp"
#include "cuda/NcclCommunicator.hpp"

#include <ATen/cuda/MemPool.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>
#endif

#include <pybind11/chrono.h>
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>

namespace py = pybind11;

// pybind11 makes the holder of an op's Work from the c10::intrusive_ptr<c10d::Work> torch's
// bindings return, read as a NoGilDestructor<streamnccl::Work>: one pointer, at one address.
static_assert(sizeof(streamnccl::NoGilDestructor<streamnccl::Work>) ==
              sizeof(c10::intrusive_ptr<c10d::Work>));

namespace streamnccl {
namespace {

std::string versionString(int code) {
  // NCCL >= 2.9 encodes versions as major * 10000 + minor * 100 + patch.
  return std::to_string(code / 10000) + "." + std::to_string(code % 10000 / 100) + "." +
         std::to_string(code % 100);
}

c10::intrusive_ptr<ProcessGroup> makeProcessGroup(const c10::intrusive_ptr<c10d::Store>& store,
                                                  int rank, int size,
                                                  std::chrono::milliseconds timeout,
                                                  const Options& explicitOptions,
                                                  std::shared_ptr<LazyGloo> gloo,
                                                  const std::string& groupName) {
  auto options = Options::fromEnv(explicitOptions);
  options->timeout = timeout;
  options->group_name = groupName;  // NCCL's name for the group's communicators
  ProcessGroup::PathFactories factories;
  factories.emplace(c10::kCPU, std::make_unique<HostPathFactory>(std::move(gloo)));
#ifdef STREAMNCCL_WITH_NCCL
  factories.emplace(c10::kCUDA,
                    std::make_unique<CudaPathFactory>(NcclApi::library(), CudaApi::runtime(), store,
                                                      rank, size, options));
#endif
  return ProcessGroup::make(rank, size, options, std::move(factories), store);
}

// open_gloo, callable from any thread (it takes the GIL), and let go of without the GIL once
// the interpreter is finalizing (a group may be destroyed that late, on a thread of its own).
LazyGloo::Open glooOpener(py::function open) {
  std::shared_ptr<py::function> held(new py::function(std::move(open)), [](py::function* fn) {
#if PY_VERSION_HEX >= 0x030D0000
    const bool finalizing = Py_IsFinalizing() != 0;
#else
    const bool finalizing = _Py_IsFinalizing() != 0;
#endif
    if (Py_IsInitialized() == 0 || finalizing) {
      return;  // leaked: no Python left to take it back
    }
    py::gil_scoped_acquire gil;
    delete fn;
  });
  return [held](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                std::chrono::milliseconds timeout) {
    py::gil_scoped_acquire gil;
    try {
      return (*held)(store, rank, size, timeout).cast<c10::intrusive_ptr<c10d::Backend>>();
    } catch (py::error_already_set& e) {
      throw std::runtime_error(e.what());  // described while the GIL is held
    }
  };
}

using Segments = std::vector<std::pair<void*, size_t>>;

// The memory handed to _register_memory: (address, bytes) pairs of Python ints.
Segments segmentsOf(const std::vector<std::pair<uintptr_t, size_t>>& raw) {
  Segments segments;
  for (const auto& [address, bytes] : raw) {
    segments.emplace_back(reinterpret_cast<void*>(address), bytes);
  }
  return segments;
}

#ifdef STREAMNCCL_WITH_NCCL
// The segments of a torch.cuda.MemPool now, and the device they are on.
std::pair<c10::Device, Segments> poolSegments(at::cuda::MemPool& pool) {
  const c10::Device device(c10::kCUDA, pool.device());
  Segments segments;
  for (const auto& segment : c10::cuda::CUDACachingAllocator::snapshot(pool.id()).segments) {
    TORCH_INTERNAL_ASSERT(segment.device == pool.device(),
                          "streamnccl: a segment of the MemPool of ", device,
                          " is on cuda:", static_cast<int>(segment.device));
    segments.emplace_back(reinterpret_cast<void*>(segment.address), segment.total_size);
  }
  return {device, std::move(segments)};
}

// register_mem_pool and deregister_mem_pool, as ProcessGroupNCCL has them: every segment the
// pool has at the call. Segments it grows later are registered by calling register_mem_pool
// again (those registered already are left as they are); ProcessGroupNCCL's allocator hooks,
// which do so by themselves, are not followed.
void bindMemPools(py::class_<ProcessGroup, c10d::Backend, NoGilDestructor<ProcessGroup>>& group) {
  group
      .def(
          "register_mem_pool",
          [](ProcessGroup& self, at::cuda::MemPool& pool, bool symm) {
            TORCH_CHECK_NOT_IMPLEMENTED(!symm, "streamnccl register_mem_pool: symm=True (NCCL's ",
                                        "symmetric windows) is not supported; expected False");
            auto [device, segments] = poolSegments(pool);
            self.registerMemory(device, segments, /*skipRegistered=*/true);
          },
          py::arg("pool"), py::arg("symm") = false, py::call_guard<py::gil_scoped_release>(),
          "Registers the pool's segments with the group's NCCL communicator of its device.")
      .def(
          "deregister_mem_pool",
          [](ProcessGroup& self, at::cuda::MemPool& pool) {
            auto [device, segments] = poolSegments(pool);
            std::vector<void*> addresses;
            for (const auto& segment : segments) {
              addresses.push_back(segment.first);
            }
            self.deregisterMemory(device, addresses, /*skipUnknown=*/true);
          },
          py::arg("pool"), py::call_guard<py::gil_scoped_release>(),
          "Deregisters what register_mem_pool registered, once the ops that may use it ran.");
}
#endif

py::dict buildInfo() {
  py::dict info;
  info["version"] = STREAMNCCL_VERSION;
#ifdef STREAMNCCL_WITH_NCCL
  info["paths"] = std::vector<std::string>{"host", "nccl"};
  info["nccl_version_compiled"] = versionString(ncclCompiledVersion());
  info["nccl_version_loaded"] = versionString(ncclLoadedVersion());
  info["cuda_version_compiled"] = versionString(CUDART_VERSION * 10);
#else
  info["paths"] = std::vector<std::string>{"host"};
  info["nccl_version_compiled"] = py::none();
  info["nccl_version_loaded"] = py::none();
  info["cuda_version_compiled"] = py::none();
#endif
  return info;
}

}  // namespace
}  // namespace streamnccl

PYBIND11_MODULE(_C, m) {
  using namespace streamnccl;
  // Registers c10d's Backend, Store and Options types, which ours derive from or take.
  py::module_::import("torch.distributed");

  m.doc() = "streamnccl: a torch.distributed backend with explicit stream semantics";

  py::class_<Options::NcclConfig>(m, "NcclConfig",
                                  "How NCCL makes a group's communicators (ncclConfig_t), as "
                                  "ProcessGroupNCCL.Options().config; unset fields are NCCL's "
                                  "defaults, and NCCL's NCCL_* variables override any field")
      .def(py::init([](std::optional<bool> blocking, std::optional<int> cgaClusterSize,
                       std::optional<int> minCtas, std::optional<int> maxCtas,
                       std::optional<std::string> netName, std::optional<bool> splitShare) {
             return Options::NcclConfig{blocking, cgaClusterSize, minCtas,
                                        maxCtas,  netName,        splitShare};
           }),
           py::kw_only(), py::arg("blocking") = py::none(),
           py::arg("cga_cluster_size") = py::none(), py::arg("min_ctas") = py::none(),
           py::arg("max_ctas") = py::none(), py::arg("net_name") = py::none(),
           py::arg("split_share") = py::none())
      .def_readwrite("blocking", &Options::NcclConfig::blocking)
      .def_readwrite("cga_cluster_size", &Options::NcclConfig::cgaClusterSize)
      .def_readwrite("min_ctas", &Options::NcclConfig::minCtas)
      .def_readwrite("max_ctas", &Options::NcclConfig::maxCtas)
      .def_readwrite("net_name", &Options::NcclConfig::netName)
      .def_readwrite("split_share", &Options::NcclConfig::splitShare);

  py::class_<Options, c10d::Backend::Options, c10::intrusive_ptr<Options>>(m, "Options")
      .def(py::init(
               [](std::optional<bool> highPriorityStreams, std::optional<bool> blockingWait,
                  std::optional<std::string> dumpDir, std::optional<int> traceBufferSize,
                  std::optional<bool> debugChecks, std::optional<bool> enableTiming,
                  std::optional<bool> singleHardwareQueue, std::optional<bool> checkInflightWrites,
                  std::optional<Options::NcclConfig> config, std::optional<bool> propagateErrors) {
                 auto options = c10::make_intrusive<Options>();
                 if (config) {
                   options->ncclConfig = *config;
                 }
                 options->checkInflightWrites = checkInflightWrites;
                 options->propagateErrors = propagateErrors;
                 options->singleHardwareQueue = singleHardwareQueue;
                 options->enableTiming = enableTiming;
                 options->highPriorityStreams = highPriorityStreams;
                 options->blockingWait = blockingWait;
                 options->dumpDir = std::move(dumpDir);
                 options->traceBufferSize = traceBufferSize;
                 options->debugChecks = debugChecks;
                 return options;
               }),
           py::kw_only(), py::arg("high_priority_streams") = py::none(),
           py::arg("blocking_wait") = py::none(), py::arg("dump_dir") = py::none(),
           py::arg("trace_buffer_size") = py::none(), py::arg("debug_checks") = py::none(),
           py::arg("enable_timing") = py::none(), py::arg("single_hardware_queue") = py::none(),
           py::arg("check_inflight_writes") = py::none(), py::arg("config") = py::none(),
           py::arg("propagate_errors") = py::none())
      .def_readwrite("high_priority_streams", &Options::highPriorityStreams)
      .def_readwrite("blocking_wait", &Options::blockingWait)
      .def_readwrite("dump_dir", &Options::dumpDir)
      .def_readwrite("trace_buffer_size", &Options::traceBufferSize)
      .def_readwrite("debug_checks", &Options::debugChecks)
      .def_readwrite("enable_timing", &Options::enableTiming)
      .def_readwrite("single_hardware_queue", &Options::singleHardwareQueue)
      .def_readwrite("check_inflight_writes", &Options::checkInflightWrites)
      .def_readwrite("propagate_errors", &Options::propagateErrors)
      .def_readwrite("config", &Options::ncclConfig,
                     "NCCL's configuration of the group's communicators (a NcclConfig)")
      .def("__copy__", [](const Options& self) { return c10::make_intrusive<Options>(self); })
      .def(
          "__deepcopy__",
          [](const Options& self, const py::dict&) { return c10::make_intrusive<Options>(self); },
          py::arg("memo"))
      .def(
          "resolved", [](const Options& self) { return Options::fromEnv(self); },
          "A copy with every unset setting taken from STREAMNCCL_* variables or defaults.");

  // What every op hands back, c10d's Work with a wait() of its own: c10d's releases the GIL,
  // which a sync op's wait() (every dist.all_reduce waits on one) does not need.
  py::class_<Work, c10d::Work, NoGilDestructor<Work>>(m, "Work").def(
      "wait",
      [](Work& self, std::chrono::milliseconds timeout) {
        if (self.waitReturnsAtOnce(timeout)) {
          return self.wait(timeout);
        }
        py::gil_scoped_release noGil;
        return self.wait(timeout);
      },
      py::arg("timeout") = kNoTimeout,
      "Waits for the op as c10d's Work.wait() does (see docs/stream-contract.md).");

  py::class_<ProcessGroup, c10d::Backend, NoGilDestructor<ProcessGroup>> group(m, "ProcessGroup");
  group
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout, const Options& options,
                       py::function openGloo, const std::string& groupName) {
             return makeProcessGroup(
                 store, rank, size, timeout, options,
                 LazyGloo::deferred(glooOpener(std::move(openGloo)), store, rank, size, timeout),
                 groupName);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
           py::arg("options"), py::kw_only(), py::arg("open_gloo"), py::arg("group_name") = "",
           "A group whose host path opens Gloo with open_gloo(store, rank, size) at its first CPU "
           "op.")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout, const Options& options,
                       c10::intrusive_ptr<c10d::Backend> gloo, const std::string& groupName) {
             return makeProcessGroup(store, rank, size, timeout, options,
                                     LazyGloo::of(std::move(gloo)), groupName);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
           py::arg("options"), py::arg("gloo"), py::arg("group_name") = "",
           "A group whose host path runs on `gloo`, made already.")
      .def_property_readonly("streamnccl_options", &ProcessGroup::options)
      // As ProcessGroupNCCL's: dist.split_group without pg_options deep-copies it.
      .def_property_readonly(
          "options",
          [](const ProcessGroup& self) { return c10::make_intrusive<Options>(*self.options()); },
          "A copy of the group's settings.")
      .def("_set_global_ranks", &ProcessGroup::setGlobalRanks, py::arg("global_ranks"),
           "The global rank of each member, which the flight recorder's dump names.")
      .def("_stats",
           [](const ProcessGroup& self) {
             return torch::jit::toPyObject(c10::IValue(self.statsSnapshot()));
           })
      .def("_reset_stats", &ProcessGroup::resetStats)
      // torch 2.15 binds get_error on every Backend; 2.11 only on its own backends.
      // Without the GIL: it may wait for a break to fail its ops, whose callbacks take it.
      .def("get_error", &ProcessGroup::getError, py::call_guard<py::gil_scoped_release>(),
           "SUCCESS until the group breaks, then TIMEOUT, COMM_ERROR or REMOTE_ERROR.")
      // What torch's split_group asks of every rank of this group (`options`: its pg_options),
      // and, with `agreement` (the new group's name), what python/streamnccl asks of the
      // members of a subgroup new_group makes (see ProcessGroup::splitAs).
      .def(
          "_split",
          [](ProcessGroup& self, const c10::intrusive_ptr<c10d::Store>& store,
             const std::vector<int>& ranks, const c10::intrusive_ptr<Options>& options,
             const std::string& agreement) {
            return self.splitAs(store, ranks, options, agreement);
          },
          py::arg("store"), py::arg("ranks"), py::arg("options") = nullptr,
          py::arg("agreement") = "", py::call_guard<py::gil_scoped_release>())
      // The part in that split of a rank outside the subgroup (python/streamnccl's
      // perform_nocolor_split, which torch calls).
      .def("_split_without", &ProcessGroup::splitWithout, py::arg("device"), py::arg("agreement"),
           py::call_guard<py::gil_scoped_release>())
      .def("_refuse_split", &ProcessGroup::refuseSplit, py::arg("agreement"), py::arg("why"),
           py::call_guard<py::gil_scoped_release>())
      // What register_mem_pool and deregister_mem_pool do with a pool's segments, for memory
      // of any device the group has a communicator on (the fake GPU's tests use it).
      .def(
          "_register_memory",
          [](ProcessGroup& self, const c10::Device& device,
             const std::vector<std::pair<uintptr_t, size_t>>& segments) {
            self.registerMemory(device, segmentsOf(segments));
          },
          py::arg("device"), py::arg("segments"), py::call_guard<py::gil_scoped_release>())
      .def(
          "_deregister_memory",
          [](ProcessGroup& self, const c10::Device& device, const std::vector<uintptr_t>& raw) {
            std::vector<void*> addresses;
            for (uintptr_t address : raw) {
              addresses.push_back(reinterpret_cast<void*>(address));
            }
            self.deregisterMemory(device, addresses);
          },
          py::arg("device"), py::arg("addresses"), py::call_guard<py::gil_scoped_release>());
#ifdef STREAMNCCL_WITH_NCCL
  bindMemPools(group);
#endif

  m.def("_build_info", &buildInfo, "What this build of the extension contains.");
  m.def(
      "_dump_flight_recorder",
      [] {
        std::string dump;
        {
          // Without the GIL: letting go of a retired op's tensors may need it.
          py::gil_scoped_release noGil;
          ProcessGroup::retireCompletedOfAll();
          dump = FlightRecorder::instance().dump();
        }
        return py::bytes(dump);
      },
      "This process's flight recorder, pickled as torch's flight recorder dumps are.");
  m.def("_store_of_this_attempt", &keys::storeOfThisAttempt, py::arg("store"),
        "The store as a restarted torchelastic worker keeps to it: its attempt's keys apart.");
  m.def("_shutdown_all_groups", &ProcessGroup::shutdownAll,
        py::call_guard<py::gil_scoped_release>(),
        "Shuts every live group down (finishing its ops first); registered to run at exit.");
}
