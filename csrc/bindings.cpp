// The Python module streamnccl._C: binds Options and ProcessGroup, and is the one place that
// knows both the core and the concrete paths (host always, NCCL when compiled).

#include "core/FlightRecorder.hpp"
#include "core/Options.hpp"
#include "core/ProcessGroup.hpp"
#include "host/HostPath.hpp"
#include "sim/SimController.hpp"

#ifdef STREAMNCCL_WITH_NCCL
#include "cuda/CudaPath.hpp"
#include "cuda/NcclCommunicator.hpp"
#include "fake/FakeGpu.hpp"
#include "fake/FakeMemory.hpp"
#include "fake/FakeNcclWorld.hpp"
#include "fake/NoOpDevice.hpp"
#include "fake/RecordingCuda.hpp"
#include "fake/RecordingNccl.hpp"

#include <cuda_runtime_api.h>
#endif

#include <pybind11/chrono.h>
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>

namespace py = pybind11;

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
      py::gil_scoped_release noGil;
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

// Test-only: the simulated device of the ordering tests (csrc/sim/), under private names.
void bindSimulation(py::module_& m) {
  using sim::SimController;
  using sim::SimRead;
  py::class_<SimRead>(m, "_SimulatedRead")
      .def("value", &SimRead::value, py::arg("timeout"), py::call_guard<py::gil_scoped_release>());
  py::class_<SimController, NoGilDestructor<SimController>>(m, "_SimulatedDevice")
      .def(py::init([](uint64_t seed, int64_t maxDelayUs, bool dropDependencies) {
             return c10::make_intrusive<SimController>(
                 sim::SimSettings{seed, std::chrono::microseconds(maxDelayUs), dropDependencies});
           }),
           py::kw_only(), py::arg("seed"), py::arg("max_delay_us"),
           py::arg("drop_dependencies") = false)
      .def(
          "process_group",
          [](SimController& self, int rank, int size, std::chrono::milliseconds timeout,
             c10::intrusive_ptr<c10d::Backend> gloo) {
            return NoGilDestructor<ProcessGroup>(
                self.processGroup(rank, size, timeout, std::move(gloo)));
          },
          py::arg("rank"), py::arg("size"), py::arg("timeout"), py::arg("gloo"))
      .def("write", &SimController::write, py::arg("tensor"), py::arg("value"))
      .def("read", &SimController::read, py::arg("tensor"))
      .def("synchronize", &SimController::synchronize, py::call_guard<py::gil_scoped_release>())
      .def("reseed", &SimController::reseed, py::arg("seed"))
      .def("hold_internal_streams", &SimController::holdInternalStreams, py::arg("held"))
      .def(
          "empty", [](SimController& self, int64_t numel) { return self.memory().empty(numel); },
          py::arg("numel"))
      .def_property_readonly("reuses", [](SimController& self) { return self.memory().reuses(); });
}

#ifdef STREAMNCCL_WITH_NCCL
cudaStreamCaptureMode captureMode(const std::string& name) {
  if (name == "global") return cudaStreamCaptureModeGlobal;
  if (name == "thread_local") return cudaStreamCaptureModeThreadLocal;
  TORCH_CHECK_VALUE(name == "relaxed", "capture mode is global, thread_local or relaxed, not ",
                    name);
  return cudaStreamCaptureModeRelaxed;
}

fake::FakeModels modelsFrom(const std::map<std::string, bool>& switches) {
  fake::FakeModels models;
  for (const auto& [name, on] : switches) {
    TORCH_CHECK_VALUE(models.set(name, on), "no fake GPU model is called ", name);
  }
  return models;
}

// Test-only: groups whose CUDA path runs on the fakes of NCCL and CUDA (csrc/fake/). Their CPU
// tensors take the CUDA path on a fake GPU, whose log and checks the tests read.
void bindRecording(py::module_& m) {
  using fake::FakeGpu;
  using Millis = std::chrono::milliseconds;
  py::class_<fake::FakeNcclWorld, std::shared_ptr<fake::FakeNcclWorld>>(m, "_FakeNcclWorld")
      .def(py::init([](bool simulatePeers, const std::map<std::string, bool>& models) {
             return std::make_shared<fake::FakeNcclWorld>(simulatePeers, modelsFrom(models));
           }),
           py::arg("simulate_peers"), py::arg("models") = std::map<std::string, bool>{},
           "Where the ranks' fake GPUs meet; `models` switches modelled semantics on or off.");
  py::class_<fake::FakeRead, std::shared_ptr<fake::FakeRead>>(m, "_FakeRead")
      .def(
          "value",
          [](fake::FakeRead& read, Millis timeout) {
            at::Tensor value = read.value(timeout);
            TORCH_CHECK(value.defined(), "the stream did not get to the read within ",
                        timeout.count(), " ms");
            return value;
          },
          py::arg("timeout") = Millis(10000), py::call_guard<py::gil_scoped_release>());
  py::class_<FakeGpu, std::shared_ptr<FakeGpu>>(m, "_FakeGpu")
      .def("calls", [](FakeGpu& gpu) { return gpu.log().calls(); })
      .def("clear", [](FakeGpu& gpu) { gpu.log().clear(); })
      .def(
          "record_calls", [](FakeGpu& gpu, bool on) { gpu.log().setRecording(on); }, py::arg("on"),
          "Off: calls and buffers go unrecorded (violations still are).")
      .def("violations", [](FakeGpu& gpu) { return gpu.log().takeViolations(); })
      .def("buffers",
           [](FakeGpu& gpu) {
             std::vector<std::tuple<std::string, uintptr_t, uintptr_t, size_t>> rows;
             for (const auto& record : gpu.log().buffers()) {
               rows.emplace_back(record.call, record.send, record.recv, record.bytes);
             }
             return rows;
           })
      .def("ran", &FakeGpu::ran, "What ran on the GPU, in order: 'S1 ncclAllReduce', ...")
      .def(
          "fail_next", [](FakeGpu& gpu, std::string fn) { gpu.log().failNext(std::move(fn)); },
          py::arg("function"))
      .def(
          "in_progress_next",
          [](FakeGpu& gpu, std::string fn, int polls) {
            gpu.log().inProgressNext(std::move(fn), polls);
          },
          py::arg("function"), py::arg("polls"))
      .def("fail_cuda", &FakeGpu::failCuda, py::arg("call"), py::arg("error"),
           py::arg("sticky") = false)
      .def("hold_events", &FakeGpu::hold, py::arg("held"),
           "While held, nothing runs on this GPU: what was issued since looks stuck.")
      .def("synchronize", &FakeGpu::synchronize, py::arg("timeout") = Millis(10000),
           py::call_guard<py::gil_scoped_release>(),
           "Waits until the GPU has run everything; False if it is stuck.")
      .def("read", &FakeGpu::read, py::arg("tensor"),
           "A read of `tensor` on the calling thread's current stream, as a kernel of the user's")
      .def("write", &FakeGpu::write, py::arg("tensor"), py::arg("value"))
      .def("future_streams", &FakeGpu::futureStreams,
           "The current stream (its number, as ran() names it: S<n>) at each request of the "
           "NCCL path for a future naming this GPU's device")
      .def("set_nccl_version", &FakeGpu::setNcclVersion, py::arg("version"),
           "The version ncclGetVersion reports, e.g. 22605 for an NCCL without ncclCommShrink.")
      .def_static(
          "memory_live",
          [](uintptr_t address) {
            return fake::FakeMemory::instance().lookup(reinterpret_cast<const void*>(address)).live;
          },
          py::arg("address"), "Whether the fake allocator's block at `address` is held.")
      .def_static(
          "frees_by_thread", [] { return fake::FakeMemory::instance().freesByThread(); },
          "How many blocks each thread (by name) has freed.")
      .def("contexts", &FakeGpu::contexts)
      .def("set_device", &FakeGpu::setCurrentDevice, py::arg("index"),
           "The calling thread's current device (-1: none).")
      .def_static("current_device", &FakeGpu::currentDevice)
      .def_static("nccl_group_depth", &fake::RecordingNccl::groupDepthOfThread,
                  "How deep the calling thread is in NCCL groups (0: none open).")
      .def_static(
          "forget_thread_device", [] { FakeGpu::forgetCurrentDevice(); },
          "The calling thread has no current device again (between tests).")
      .def("use_stream", &FakeGpu::exchangeCurrentStream, py::arg("stream"),
           "Makes stream S<stream> the calling thread's current one; returns the previous.")
      .def(
          "begin_capture",
          [](FakeGpu& gpu, const std::string& mode) { gpu.beginCapture(captureMode(mode)); },
          py::arg("mode"))
      .def("end_capture", &FakeGpu::endCapture)
      .def("last_graph", &FakeGpu::lastGraph)
      .def("replay", &FakeGpu::replay, py::arg("graph"))
      .def("destroy_graph", &FakeGpu::destroyGraph, py::arg("graph"));
  m.def(
      "_recording_process_group",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, Millis timeout,
         bool highPriorityStreams, bool blockingWait, std::shared_ptr<fake::FakeNcclWorld> world,
         int deviceIndex, int computeCapability, bool enableTiming, int traceBufferSize,
         bool debugChecks, std::optional<std::string> dumpDir, bool singleHardwareQueue,
         bool checkInflightWrites, const std::map<std::string, bool>& models,
         std::optional<Options::NcclConfig> config, const std::string& groupName) {
        if (!world) {
          world = std::make_shared<fake::FakeNcclWorld>(/*simulatePeers=*/true, modelsFrom(models));
        }
        auto gpu = std::make_shared<FakeGpu>(world, deviceIndex, computeCapability);
        auto options = c10::make_intrusive<Options>();
        options->timeout = timeout;
        options->highPriorityStreams = highPriorityStreams;
        options->blockingWait = blockingWait;
        options->enableTiming = enableTiming;
        options->traceBufferSize = traceBufferSize;
        options->debugChecks = debugChecks;
        options->dumpDir = std::move(dumpDir);
        options->singleHardwareQueue = singleHardwareQueue;
        options->checkInflightWrites = checkInflightWrites;
        if (config) {
          options->ncclConfig = *config;
        }
        options->group_name = groupName;
        ProcessGroup::PathFactories factories;
        factories.emplace(c10::kCPU, std::make_unique<CudaPathFactory>(
                                         std::make_shared<fake::RecordingNccl>(gpu, world),
                                         std::make_shared<fake::RecordingCuda>(gpu, c10::kCPU),
                                         store, rank, size, options));
        auto group = ProcessGroup::make(rank, size, options, std::move(factories), store);
        return std::make_pair(NoGilDestructor<ProcessGroup>(group), gpu);
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
      py::arg("high_priority_streams") = false, py::arg("blocking_wait") = false,
      py::arg("world") = nullptr, py::arg("device_index") = 0, py::arg("compute_capability") = 90,
      py::arg("enable_timing") = false, py::arg("trace_buffer_size") = 0,
      py::arg("debug_checks") = false, py::arg("dump_dir") = py::none(),
      py::arg("single_hardware_queue") = false, py::arg("check_inflight_writes") = false,
      py::arg("models") = std::map<std::string, bool>{}, py::arg("config") = py::none(),
      py::arg("group_name") = "");

  // For `python -m streamnccl.bench.launch`: the NCCL path over CUDA and NCCL calls that do
  // nothing (fake/NoOpDevice.hpp), its tensors CPU tensors: one rank, streamnccl's own cost.
  m.def(
      "_no_op_device_process_group",
      [](const c10::intrusive_ptr<c10d::Store>& store, Millis timeout, int traceBufferSize) {
        auto options = c10::make_intrusive<Options>();
        options->timeout = timeout;
        options->traceBufferSize = traceBufferSize;
        ProcessGroup::PathFactories factories;
        factories.emplace(c10::kCPU, std::make_unique<CudaPathFactory>(
                                         std::make_shared<fake::NoOpNccl>(),
                                         std::make_shared<fake::NoOpCuda>(c10::kCPU), store,
                                         /*rank=*/0, /*size=*/1, options));
        return NoGilDestructor<ProcessGroup>(
            ProcessGroup::make(0, 1, options, std::move(factories), store));
      },
      py::arg("store"), py::arg("timeout"), py::arg("trace_buffer_size") = 0);
}
#endif

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
      .def(py::init([](std::optional<bool> highPriorityStreams, std::optional<bool> blockingWait,
                       std::optional<std::string> dumpDir, std::optional<int> traceBufferSize,
                       std::optional<bool> debugChecks, std::optional<bool> enableTiming,
                       std::optional<bool> singleHardwareQueue,
                       std::optional<bool> checkInflightWrites,
                       std::optional<Options::NcclConfig> config) {
             auto options = c10::make_intrusive<Options>();
             if (config) {
               options->ncclConfig = *config;
             }
             options->checkInflightWrites = checkInflightWrites;
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
           py::arg("check_inflight_writes") = py::none(), py::arg("config") = py::none())
      .def_readwrite("high_priority_streams", &Options::highPriorityStreams)
      .def_readwrite("blocking_wait", &Options::blockingWait)
      .def_readwrite("dump_dir", &Options::dumpDir)
      .def_readwrite("trace_buffer_size", &Options::traceBufferSize)
      .def_readwrite("debug_checks", &Options::debugChecks)
      .def_readwrite("enable_timing", &Options::enableTiming)
      .def_readwrite("single_hardware_queue", &Options::singleHardwareQueue)
      .def_readwrite("check_inflight_writes", &Options::checkInflightWrites)
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
      "Waits for the op as c10d's Work.wait() does (see the README's stream contract).");

  py::class_<ProcessGroup, c10d::Backend, NoGilDestructor<ProcessGroup>>(m, "ProcessGroup")
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
           py::call_guard<py::gil_scoped_release>());

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
  m.def("_shutdown_all_groups", &ProcessGroup::shutdownAll,
        py::call_guard<py::gil_scoped_release>(),
        "Shuts every live group down (finishing its ops first); registered to run at exit.");
  bindSimulation(m);
#ifdef STREAMNCCL_WITH_NCCL
  bindRecording(m);
#endif
}
