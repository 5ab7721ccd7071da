// FakeGpu's kernels: the NCCL path's ATen and NCCL kernels as stream items, the checks of
// what they use, and the engine's side of running them (FakeNcclWorld::advance).

#include "fake/FakeCollectives.hpp"
#include "fake/FakeGpu.hpp"
#include "fake/FakeGpuShared.hpp"
#include "fake/FakeNcclWorld.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>

namespace streamnccl::fake {
namespace {

using detail::deviceName;
using detail::Lock;

std::vector<at::Tensor> views(const std::vector<TensorView>& tensors) {
  std::vector<at::Tensor> made;
  made.reserve(tensors.size());
  for (const auto& tensor : tensors) {
    made.push_back(tensor.view());
  }
  return made;
}

}  // namespace

Buffer FakeGpu::buffer(const void* pointer, const char* role) const {
  return Buffer{pointer, role, FakeMemory::instance().lookup(pointer)};
}

void FakeGpu::push(StreamId streamId, Item item,
                   std::optional<std::pair<StreamId, uint64_t>> waitOnCaptured) {
  item.issued = ++issued_;
  if (capturedLocked(streamId)) {
    // A graph node: it runs at each replay, not now.
    capture_->captured.push_back(CapturedItem{streamId, std::move(item), waitOnCaptured});
    ++capture_->items[streamId];
    return;
  }
  Stream& target = stream(streamId);
  target.pending.push_back(std::move(item));
  ++target.enqueued;
  world_->notify();
}

void FakeGpu::launchAten(const Kernel& kernel, c10::ArrayRef<at::Tensor> outputs,
                         c10::ArrayRef<at::Tensor> inputs, int64_t scalar) {
  if (!models().atenKernels) {
    kernel.run(outputs, inputs, scalar);  // at once, as if the CPU were the device
    return;
  }
  Item item;
  item.kind = Item::Kind::Aten;
  item.name = kernel.name;
  item.run = kernel.run;
  item.scalar = scalar;
  for (const auto& output : outputs) {
    item.outputs.push_back(TensorView::of(output));
    if (output.numel() > 0) {
      item.buffers.push_back(buffer(output.data_ptr(), "output"));
    }
  }
  for (const auto& input : inputs) {
    item.inputs.push_back(TensorView::of(input));
    if (input.numel() > 0) {
      item.buffers.push_back(buffer(input.data_ptr(), "input"));
    }
  }
  Lock lock(world_->mutex());
  push(currentStream(), std::move(item));  // where ATen would enqueue it
}

void FakeGpu::launchNccl(StreamId streamId, std::shared_ptr<NcclLaunch> launch,
                         std::vector<Buffer> buffers) {
  Lock lock(world_->mutex());
  std::string names;
  for (const NcclOp& op : launch->ops) {
    static const char* const kNames[] = {"ncclAllReduce", "ncclBroadcast",     "ncclReduce",
                                         "ncclAllGather", "ncclReduceScatter", "ncclAlltoAll",
                                         "ncclSend",      "ncclRecv"};
    names += (names.empty() ? "" : "+") + std::string(kNames[static_cast<int>(op.kind)]);
  }
  checkAlive(streamId, names);
  if (models().memory) {
    for (const Buffer& buffer : buffers) {
      if (buffer.atCall.tracked && !buffer.atCall.live) {
        log_.violation(names + " was handed a " + buffer.role + " buffer that had been freed");
      }
    }
  }
  if (!capturedLocked(streamId)) {
    world_->number(*launch);  // a captured kernel is numbered at each replay instead
  }
  Item item;
  item.kind = Item::Kind::Nccl;
  item.name = names;
  item.buffers = std::move(buffers);
  item.launch = std::move(launch);
  push(streamId, std::move(item));
}

void FakeGpu::stopLaunches(uint64_t comm, int rank) {
  Lock lock(world_->mutex());
  for (auto& [streamId, stream] : streams_) {
    for (Item& item : stream.pending) {
      if (item.kind == Item::Kind::Nccl && item.launch->comm == comm && item.launch->rank == rank &&
          !item.launch->stopped) {
        checkBuffers(streamId, item, "was stopped by ncclCommAbort");
        item.launch->stopped = true;
        item.buffers.clear();  // stopped: it touches nothing more
      }
    }
  }
  world_->notify();
}

bool FakeGpu::hasLaunches(uint64_t comm, int rank) const {
  Lock lock(world_->mutex());
  for (const auto& [streamId, stream] : streams_) {
    for (const Item& item : stream.pending) {
      if (item.kind == Item::Kind::Nccl && item.launch->comm == comm && item.launch->rank == rank &&
          !item.launch->stopped) {
        return true;
      }
    }
  }
  return false;
}

bool FakeGpu::launchUses(uint64_t comm, int rank, uintptr_t begin, uintptr_t end) const {
  auto within = [&](const void* pointer) {
    const auto address = reinterpret_cast<uintptr_t>(pointer);
    return address >= begin && address < end;
  };
  Lock lock(world_->mutex());
  for (const auto& [streamId, stream] : streams_) {
    for (const Item& item : stream.pending) {
      if (item.kind != Item::Kind::Nccl || item.launch->comm != comm || item.launch->rank != rank ||
          item.launch->stopped) {
        continue;
      }
      for (const NcclOp& op : item.launch->ops) {
        if (within(op.send) || within(op.recv)) {
          return true;
        }
      }
    }
  }
  return false;
}

void FakeGpu::checkHeldUntilGroupEnd(const std::string& name, const std::vector<Buffer>& buffers) {
  if (!models().memory) {
    return;
  }
  for (const Buffer& buffer : buffers) {
    if (!buffer.atCall.tracked) {
      continue;
    }
    const auto now = FakeMemory::instance().lookup(buffer.pointer);
    if (!now.live || now.generation != buffer.atCall.generation) {
      log_.violation(name + "'s " + buffer.role +
                     " buffer was freed inside the NCCL group, before ncclGroupEnd enqueued the "
                     "call: the stream's next allocation can overwrite it first");
    }
  }
}

void FakeGpu::checkCallContext(const std::string& call, int device, StreamId streamId) {
  bindDevice();
  if (!models().devices) {
    return;
  }
  if (currentDevice() != device) {
    log_.violation(call + " on a communicator of " + deviceName(device) +
                   " from a thread whose current device is " + deviceName(currentDevice()));
  }
  if (currentStream() != streamId) {
    log_.violation(call + " on " + name(streamId) +
                   " while the calling thread's current stream is " + name(currentStream()) +
                   ": the op's ATen work (copies, divisions) ran on another stream");
  }
}

void FakeGpu::markEnqueueInProgress(StreamId stream, const std::string& call) {
  Lock lock(world_->mutex());
  enqueueInProgress_[stream] = call;
}

void FakeGpu::clearEnqueueInProgress(StreamId stream) {
  Lock lock(world_->mutex());
  enqueueInProgress_.erase(stream);
}

void FakeGpu::poisonLater(const FakeMemory::Owner& owner, uint8_t* data, uint64_t generation) {
  if (owner.pool != 0) {
    return;  // a graph's pool: the graph writes it at each replay
  }
  Lock lock(world_->mutex());
  Item poison;
  poison.kind = Item::Kind::Poison;
  poison.name = "poison";
  poison.data = data;
  poison.generation = generation;
  poison.issued = ++issued_;
  // Not captured even on a captured stream: freeing is the allocator's, not a graph node.
  Stream& target = stream(owner.stream);
  target.pending.push_back(std::move(poison));
  ++target.enqueued;
  world_->notify();
}

// --- the engine's side

std::vector<std::pair<StreamId, const Item*>> FakeGpu::heads() const {
  std::vector<std::pair<StreamId, const Item*>> heads;
  if (held_) {
    return heads;
  }
  for (const auto& [id, stream] : streams_) {
    if (!stream.pending.empty()) {
      heads.emplace_back(id, &stream.pending.front());
    }
  }
  if (models().singleQueue && heads.size() > 1) {
    // One hardware queue: only the earliest issued may go, whatever holds it up.
    auto first = std::min_element(heads.begin(), heads.end(), [](const auto& a, const auto& b) {
      return a.second->issued < b.second->issued;
    });
    return {*first};
  }
  return heads;
}

bool FakeGpu::runHead(StreamId streamId) {
  Stream& running = stream(streamId);
  const Item& item = running.pending.front();
  FakeMemory::Untracked fakesOwn;
  switch (item.kind) {
    case Item::Kind::Wait:
      if (stream(item.waitStream).ran < item.waitPosition) {
        return false;
      }
      break;
    case Item::Kind::Poison:
      FakeMemory::instance().poisonIfStillFree(item.data, item.generation);
      break;
    case Item::Kind::Host:
      if (checkBuffers(streamId, item, "ran")) {
        item.host();
      }
      break;
    case Item::Kind::Aten:
      if (checkBuffers(streamId, item, "ran")) {
        try {
          item.run(views(item.outputs), views(item.inputs), item.scalar);
        } catch (const std::exception& e) {
          log_.violation(item.name + " on " + name(streamId) + " failed: " + e.what());
        }
      }
      break;
    case Item::Kind::Nccl: {
      const NcclLaunch& launch = *item.launch;
      if (launch.stopped) {
        break;
      }
      world_->checkNotDestroyed(*this, streamId, item);
      if (!checkBuffers(streamId, item, "ran")) {
        break;
      }
      const bool outOfBounds = std::any_of(launch.ops.begin(), launch.ops.end(),
                                           [](const NcclOp& op) { return op.outOfBounds; });
      if (models().peers && world_->simulatesPeers() && !outOfBounds) {
        // Its peers are mirrors of this member: a collective computes from n copies of its
        // buffers. (A mirror's message is not modelled: a recv keeps what it held.)
        for (const NcclOp& op : launch.ops) {
          if (op.collective()) {
            runMirroredCollective(op, launch.rank, launch.nranks);
          }
        }
      }
      break;
    }
  }
  popHead(streamId);
  return true;
}

void FakeGpu::popHead(StreamId streamId) {
  Stream& running = stream(streamId);
  const Item& item = running.pending.front();
  if (item.kind != Item::Kind::Wait && item.kind != Item::Kind::Poison) {
    ran_.push_back(name(streamId) + " " + item.name);
  }
  running.pending.pop_front();
  ++running.ran;
}

bool FakeGpu::checkBuffers(StreamId streamId, const Item& item, const char* until) {
  if (!models().memory) {
    return true;
  }
  bool intact = true;
  for (const Buffer& buffer : item.buffers) {
    if (!buffer.atCall.tracked) {
      continue;
    }
    const auto now = FakeMemory::instance().lookup(buffer.pointer);
    if (!now.tracked) {
      log_.violation(item.name + " on " + name(streamId) + " " + until + " after its " +
                     buffer.role + " buffer was freed and returned to the system");
      intact = false;
      continue;
    }
    if (item.replay != 0) {
      // The graph's pool keeps its memory for the replays. But memory the capture freed and
      // handed to a later allocation holds two tensors: every use of the earlier one must run
      // before any of the later one's, which only the graph's own order can ensure.
      uint64_t& latest = replayUses_[{item.replay, now.start}];
      if (buffer.atCall.generation < latest) {
        log_.violation("a replay of " + item.name + " on " + name(streamId) + " " + until +
                       " on its " + buffer.role +
                       " buffer after a kernel of the tensor that "
                       "the capture gave the same memory to later: it was freed too early");
      }
      latest = std::max(latest, buffer.atCall.generation);
      continue;
    }
    if (now.live && now.generation == buffer.atCall.generation) {
      continue;  // held since the call
    }
    // Memory freed and reused on the item's own stream is safe: later work there runs after
    // it. From any other stream it is not.
    // (A block of no GPU's was allocated by a thread that had not used one yet: on the
    // default stream, as a GPU would have it.)
    const bool ownStream = (buffer.atCall.owner.gpu == serial_ || buffer.atCall.owner.gpu == 0) &&
                           buffer.atCall.owner.stream == streamId;
    if (!ownStream) {
      log_.violation(item.name + " on " + name(streamId) + " " + until + " after its " +
                     buffer.role + " buffer (allocated on " + name(buffer.atCall.owner.stream) +
                     ") was freed: nothing held it until then");
    }
  }
  return intact;
}

bool FakeGpu::idle() const {
  for (const auto& [id, stream] : streams_) {
    if (!stream.pending.empty()) {
      return false;
    }
  }
  return true;
}

}  // namespace streamnccl::fake
