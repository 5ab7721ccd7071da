// The Python module streamnccl._testing: the test doubles, for the tests and the launch bench
// only. The simulated device (csrc/sim/) always; with the NCCL path, the fakes of CUDA and NCCL
// (csrc/fake/), whose groups run the real NCCL path over them. Built only with
// STREAMNCCL_BUILD_TESTING=1, and linked against streamnccl._C, whose types it hands out.

#include "NoGilDestructor.hpp"
#include "core/Options.hpp"
#include "core/ProcessGroup.hpp"
#include "sim/SimController.hpp"
#include "testing/TestFault.hpp"

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <condition_variable>
#include <mutex>

#ifdef STREAMNCCL_WITH_NCCL
#include "cuda/CudaPath.hpp"
#include "fake/FakeGpu.hpp"
#include "fake/FakeMemory.hpp"
#include "fake/FakeNcclWorld.hpp"
#include "fake/NoOpDevice.hpp"
#include "fake/RecordingCuda.hpp"
#include "fake/RecordingNccl.hpp"

#include <cuda_runtime_api.h>
#endif

#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

namespace py = pybind11;

namespace streamnccl {
namespace {

// The simulated device of the ordering tests (csrc/sim/).
void bindSimulation(py::module_& m) {
  using sim::SimController;
  using sim::SimRead;
  py::class_<SimRead>(m, "SimulatedRead")
      .def("value", &SimRead::value, py::arg("timeout"), py::call_guard<py::gil_scoped_release>());
  py::class_<SimController, NoGilDestructor<SimController>>(m, "SimulatedDevice")
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

// Groups whose CUDA path runs on the fakes of NCCL and CUDA (csrc/fake/). Their CPU
// tensors take the CUDA path on a fake GPU, whose log and checks the tests read.
void bindRecording(py::module_& m) {
  using fake::FakeGpu;
  using Millis = std::chrono::milliseconds;
  py::class_<fake::FakeNcclWorld, std::shared_ptr<fake::FakeNcclWorld>>(m, "FakeNcclWorld")
      .def(py::init([](bool simulatePeers, const std::map<std::string, bool>& models) {
             return std::make_shared<fake::FakeNcclWorld>(simulatePeers, modelsFrom(models));
           }),
           py::arg("simulate_peers"), py::arg("models") = std::map<std::string, bool>{},
           "Where the ranks' fake GPUs meet; `models` switches modelled semantics on or off.");
  py::class_<fake::FakeRead, std::shared_ptr<fake::FakeRead>>(m, "FakeRead")
      .def(
          "value",
          [](fake::FakeRead& read, Millis timeout) {
            at::Tensor value = read.value(timeout);
            TORCH_CHECK(value.defined(), "the stream did not get to the read within ",
                        timeout.count(), " ms");
            return value;
          },
          py::arg("timeout") = Millis(10000), py::call_guard<py::gil_scoped_release>());
  py::class_<FakeGpu, std::shared_ptr<FakeGpu>>(m, "FakeGpu")
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
      .def("hold_shrinks", &FakeGpu::holdShrinks, py::arg("held"),
           "While held, a shrink or split in progress here does not finish.")
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
      .def_static("queries_of_thread", &FakeGpu::queriesOfThread,
                  "How many cudaEventQuery calls the calling thread has made.")
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
  // NCCL's memory calls on the fake, made directly: what the product never does (deregister a
  // handle twice, or on another communicator) is shown caught here.
  py::class_<fake::RecordingNccl, std::shared_ptr<fake::RecordingNccl>>(m, "FakeNccl")
      .def(py::init([](std::shared_ptr<fake::FakeNcclWorld> world, std::shared_ptr<FakeGpu> gpu) {
             return std::make_shared<fake::RecordingNccl>(std::move(gpu), std::move(world));
           }),
           py::arg("world"), py::arg("gpu"))
      .def(
          "init_alone",
          [](fake::RecordingNccl& nccl) {
            ncclUniqueId id;
            nccl.getUniqueId(&id);
            ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
            ncclComm_t comm = nullptr;
            TORCH_CHECK(nccl.commInitRankConfig(&comm, 1, id, 0, &config) == ncclSuccess,
                        "the fake's init failed");
            return reinterpret_cast<uintptr_t>(comm);
          },
          "A blocking communicator of this rank alone; its handle as an int.")
      .def(
          "mem_alloc",
          [](fake::RecordingNccl& nccl, size_t size) {
            void* ptr = nullptr;
            TORCH_CHECK(nccl.memAlloc(&ptr, size) == ncclSuccess, "the fake's ncclMemAlloc failed");
            return reinterpret_cast<uintptr_t>(ptr);
          },
          py::arg("size"))
      .def(
          "mem_free",
          [](fake::RecordingNccl& nccl, uintptr_t ptr) {
            return static_cast<int>(nccl.memFree(reinterpret_cast<void*>(ptr)));
          },
          py::arg("ptr"))
      .def(
          "register",
          [](fake::RecordingNccl& nccl, uintptr_t comm, uintptr_t ptr, size_t size) {
            void* handle = nullptr;
            TORCH_CHECK(
                nccl.commRegister(reinterpret_cast<ncclComm_t>(comm), reinterpret_cast<void*>(ptr),
                                  size, &handle) == ncclSuccess,
                "the fake's ncclCommRegister failed");
            return reinterpret_cast<uintptr_t>(handle);
          },
          py::arg("comm"), py::arg("ptr"), py::arg("size"))
      .def(
          "deregister",
          [](fake::RecordingNccl& nccl, uintptr_t comm, uintptr_t handle) {
            return static_cast<int>(nccl.commDeregister(reinterpret_cast<ncclComm_t>(comm),
                                                        reinterpret_cast<void*>(handle)));
          },
          py::arg("comm"), py::arg("handle"))
      .def(
          "all_reduce",
          [](fake::RecordingNccl& nccl, uintptr_t comm, uintptr_t ptr, size_t count, int stream) {
            void* buffer = reinterpret_cast<void*>(ptr);
            return static_cast<int>(nccl.allReduce(buffer, buffer, count, ncclFloat32, ncclSum,
                                                   reinterpret_cast<ncclComm_t>(comm),
                                                   fake::handle<cudaStream_t>(stream)));
          },
          py::arg("comm"), py::arg("ptr"), py::arg("count"), py::arg("stream") = 0,
          "An in-place float sum on stream S<stream>, the calling thread's current one.")
      .def(
          "destroy",
          [](fake::RecordingNccl& nccl, uintptr_t comm) {
            return static_cast<int>(nccl.commDestroy(reinterpret_cast<ncclComm_t>(comm)));
          },
          py::arg("comm"));
  m.def(
      "recording_process_group",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, Millis timeout,
         bool highPriorityStreams, bool blockingWait, std::shared_ptr<fake::FakeNcclWorld> world,
         int deviceIndex, int computeCapability, bool enableTiming, int traceBufferSize,
         bool debugChecks, std::optional<std::string> dumpDir, bool singleHardwareQueue,
         bool checkInflightWrites, const std::map<std::string, bool>& models,
         std::optional<Options::NcclConfig> config, const std::string& groupName,
         bool propagateErrors) {
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
        options->propagateErrors = propagateErrors;
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
      py::arg("group_name") = "",
      // Off unless asked: a lone fake group's peers (mirrors of it) answer no roll call.
      py::arg("propagate_errors") = false);

  // For `python -m streamnccl.bench.launch`: the NCCL path over CUDA and NCCL calls that do
  // nothing (fake/NoOpDevice.hpp), its tensors CPU tensors: one rank, streamnccl's own cost.
  m.def(
      "no_op_device_process_group",
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

// A Store in memory whose compareSet (the post of a group's break) does not answer until
// release(): a Store whose host vanished without closing its connections.
class StoreThatHangsOnPosts final : public c10d::HashStore {
 public:
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      released_.wait_for(lock, std::chrono::seconds(60), [this] { return release_; });
    }
    return c10d::HashStore::compareSet(key, expected, desired);
  }
  void release() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      release_ = true;
    }
    released_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable released_;
  bool release_ = false;
};

void bindStores(py::module_& m) {
  py::class_<StoreThatHangsOnPosts, c10d::Store, c10::intrusive_ptr<StoreThatHangsOnPosts>>(
      m, "StoreThatHangsOnPosts")
      .def(py::init([] { return c10::make_intrusive<StoreThatHangsOnPosts>(); }))
      .def("release", &StoreThatHangsOnPosts::release);
}

// STREAMNCCL_TEST_FAULT for every group made from now on (TestFault.hpp), and its parser, for
// the tests of its refusals.
void bindFaults(py::module_& m) {
  hooks::addHookMaker(testing::testFaultFromEnv);
  m.def("parse_test_fault", [](const std::string& spec) {
    const testing::TestFault fault = testing::parseTestFault(spec);
    return py::dict(py::arg("rank") = fault.rank, py::arg("op") = fault.op,
                    py::arg("fail") = fault.fail, py::arg("delay_ms") = fault.delay.count());
  });
}

}  // namespace
}  // namespace streamnccl

PYBIND11_MODULE(_testing, m) {
  using namespace streamnccl;
  // Registers streamnccl's types (ProcessGroup, Options), which these bindings hand out or take.
  py::module_::import("streamnccl._C");
  m.doc() = "streamnccl's test doubles: the simulated device and the fake GPU (tests only)";
  bindSimulation(m);
  bindStores(m);
  bindFaults(m);
#ifdef STREAMNCCL_WITH_NCCL
  bindRecording(m);
#endif
}
