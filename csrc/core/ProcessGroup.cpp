#include "core/ProcessGroup.hpp"

#include "core/Checks.hpp"
#include "core/Errors.hpp"
#include "core/Lowering.hpp"

#include <ATen/ATen.h>
#include <c10/util/irange.h>

namespace streamnccl {
namespace {

std::vector<c10::Device> futureDevices(const c10::Device& device) {
  // A CPU future needs no devices: it is completed only once its values are ready.
  if (device.is_cpu()) {
    return {};
  }
  return {device};
}

}  // namespace

ProcessGroup::ProcessGroup(int rank, int size, c10::intrusive_ptr<streamnccl::Options> options,
                           PathFactories factories)
    : c10d::Backend(rank, size), options_(std::move(options)), factories_(std::move(factories)) {
  TORCH_CHECK_VALUE(size > 0 && rank >= 0 && rank < size, "streamnccl: rank ", rank,
                    " is not in [0, ", size, ")");
}

ProcessGroup::~ProcessGroup() {
  // Paths go first; each device finishes what its streams hold before it stops.
  std::lock_guard<std::mutex> lock(pathsMutex_);
  paths_.clear();
}

Path& ProcessGroup::pathFor(const c10::Device& device, const char* op) {
  std::lock_guard<std::mutex> lock(pathsMutex_);
  auto found = paths_.find(device);
  if (found != paths_.end()) {
    return *found->second;
  }
  auto factory = factories_.find(device.type());
  STREAMNCCL_CHECK_ARG(factory != factories_.end(), op, "tensors on ", device,
                       " are not supported by this build of streamnccl (paths built: ",
                       factories_.count(c10::kCUDA) ? "host and NCCL" : "host only",
                       "); expected cpu", factories_.count(c10::kCUDA) ? " or cuda" : "",
                       " tensors");
  std::unique_ptr<Path> path;
  try {
    path = factory->second->open(device);
  } catch (const c10::DistBackendError&) {
    throw;  // a communication fault while connecting (NCCL init) is not a bad argument
  } catch (const c10::Error& e) {
    STREAMNCCL_CHECK_ARG(false, op, "cannot use ", device, ": ", e.what_without_backtrace());
  }
  if (!device.is_cpu()) {
    lastAcceleratorDevice_ = device;
  }
  return *paths_.emplace(device, std::move(path)).first->second;
}

c10::intrusive_ptr<Work> ProcessGroup::launch(Launch launch, Path& path, Body body) {
  OpInfo info{launch.op,
              ++seq_,
              getRank(),
              getSize(),
              getGroupUid(),
              launch.shapeOf.sizes().vec(),
              launch.shapeOf.scalar_type()};
  const auto timeout = launch.timeout == c10d::kUnsetTimeout ? options_->timeout : launch.timeout;
  auto outcome = std::make_shared<OpOutcome>(c10::ListType::create(c10::TensorType::get()),
                                             futureDevices(path.device->device()));
  auto work =
      c10::make_intrusive<Work>(info, launch.opType, path.device, outcome, launch.outputs, timeout,
                                launch.blockHostOnWait || options_->useBlockingWait());

  Device& device = *path.device;
  const c10::Stream current = device.currentStream();
  const c10::Stream opStream = launch.async ? device.internalStream() : current;
  // The task holds its communicator and tensors until it has run, whatever the caller drops.
  auto task = [outcome, info, body = std::move(body), communicator = path.communicator,
               outputs = launch.outputs, opStream]() {
    try {
      body(*communicator, opStream);
      outcome->succeed(outputs);
    } catch (...) {
      outcome->fail(info, std::current_exception());
    }
  };

  if (!launch.async) {
    device.enqueue(current, std::move(task));
    // A sync op has been issued (CUDA) or has run (host): a failure so far is raised here.
    if (auto failure = outcome->failure()) {
      std::rethrow_exception(failure);
    }
    return work;
  }

  auto ready = device.createEvent();
  ready->record(current);
  ready->block(opStream);
  device.enqueue(opStream, std::move(task));
  auto end = device.createEvent();
  end->record(opStream);

  std::vector<at::Tensor> inUse = std::move(launch.inputs);
  inUse.insert(inUse.end(), launch.outputs.begin(), launch.outputs.end());
  work->setEnd(std::move(end), std::move(inUse));
  trackInFlight(work);
  return work;
}

void ProcessGroup::trackInFlight(c10::intrusive_ptr<Work> work) {
  std::lock_guard<std::mutex> lock(inFlightMutex_);
  // Ops complete in program order, so completed ones are at the front.
  while (!inFlight_.empty() && inFlight_.front()->releaseIfCompleted()) {
    inFlight_.pop_front();
  }
  inFlight_.push_back(std::move(work));
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::allreduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::AllreduceOptions& opts) {
  constexpr const char* op = "allreduce";
  const at::Tensor& tensor = checks::singleTensor(op, "tensor", tensors);
  const ReduceKind kind = lowering::reduceKind(op, opts.reduceOp, tensor.scalar_type());
  Path& path = pathFor(tensor.device(), op);
  const bool averageBySum = kind == ReduceKind::Avg &&
                            lowering::averageBySum(op, *path.communicator, tensor.scalar_type());
  const int size = getSize();

  return launch({op, c10d::OpType::ALLREDUCE, tensor, tensors, tensors, opts.asyncOp, opts.timeout},
                path, [tensor, kind, averageBySum, size](Communicator& comm, c10::Stream stream) {
                  const at::Tensor dense = lowering::contiguous(tensor);
                  const at::Tensor buffer = lowering::asBuffer(dense);
                  comm.allReduce(buffer, buffer, averageBySum ? ReduceKind::Sum : kind, stream);
                  if (averageBySum) {
                    buffer.div_(size);
                  }
                  lowering::copyBack(tensor, dense);
                });
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::broadcast(std::vector<at::Tensor>& tensors,
                                                       const c10d::BroadcastOptions& opts) {
  constexpr const char* op = "broadcast";
  const at::Tensor& tensor = checks::singleTensor(op, "tensor", tensors);
  checks::rootInRange(op, "src", opts.rootRank, getSize());
  STREAMNCCL_CHECK_ARG(opts.rootTensor == 0, op, "`rootTensor` is ", opts.rootTensor,
                       ", expected 0 (one tensor per process)");
  Path& path = pathFor(tensor.device(), op);
  const int root = static_cast<int>(opts.rootRank);

  return launch({op, c10d::OpType::BROADCAST, tensor, tensors, tensors, opts.asyncOp, opts.timeout},
                path, [tensor, root](Communicator& comm, c10::Stream stream) {
                  const at::Tensor dense = lowering::contiguous(tensor);
                  const at::Tensor buffer = lowering::asBuffer(dense);
                  comm.broadcast(buffer, buffer, root, stream);
                  lowering::copyBack(tensor, dense);
                });
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::allgather(
    std::vector<std::vector<at::Tensor>>& outputTensors, std::vector<at::Tensor>& inputTensors,
    const c10d::AllgatherOptions& opts) {
  constexpr const char* op = "allgather";
  const at::Tensor& input = checks::singleTensor(op, "tensor", inputTensors);
  const std::vector<at::Tensor>& outputs =
      checks::allGatherOutputs(op, outputTensors, input, getSize());
  Path& path = pathFor(input.device(), op);
  const int size = getSize();

  return launch(
      {op, c10d::OpType::ALLGATHER, input, inputTensors, outputs, opts.asyncOp, opts.timeout}, path,
      [input, outputs, size](Communicator& comm, c10::Stream stream) {
        const at::Tensor dense = lowering::contiguous(input);
        // Allocated inside the task, so on CUDA the allocator ties it to the op's stream.
        const at::Tensor gathered = at::empty({size * dense.numel()}, dense.options());
        comm.allGather(lowering::asBuffer(dense), lowering::asBuffer(gathered), stream);
        const int64_t count = dense.numel();
        for (const auto r : c10::irange(size)) {
          outputs[r].copy_(gathered.narrow(0, r * count, count).view(outputs[r].sizes()));
        }
      });
}

c10::Device ProcessGroup::barrierDevice(const c10d::BarrierOptions& opts) const {
  if (!opts.device_ids.empty()) {
    return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(opts.device_ids.front()));
  }
  if (opts.device) {
    return *opts.device;
  }
  if (auto bound = getBoundDeviceId()) {
    return *bound;
  }
  std::lock_guard<std::mutex> lock(pathsMutex_);
  return lastAcceleratorDevice_.value_or(c10::Device(c10::kCPU));
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::barrier(const c10d::BarrierOptions& opts) {
  constexpr const char* op = "barrier";
  // A one-element allreduce on the group's device, whose Work blocks the host on wait():
  // barrier() is a host synchronisation point even where collectives are stream-ordered.
  const c10::Device device = barrierDevice(opts);
  Path& path = pathFor(device, op);
  const at::Tensor token = at::zeros({1}, at::TensorOptions().device(device).dtype(at::kFloat));
  return launch({op,
                 c10d::OpType::BARRIER,
                 token,
                 {token},
                 {token},
                 /*async=*/true,
                 opts.timeout,
                 /*blockHostOnWait=*/true},
                path, [token](Communicator& comm, c10::Stream stream) {
                  comm.allReduce(token, token, ReduceKind::Sum, stream);
                });
}

}  // namespace streamnccl
