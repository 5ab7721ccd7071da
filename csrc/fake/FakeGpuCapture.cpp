// FakeGpu's stream capture: captured streams and events, the capture's mode, its boundary,
// the graph's private pool, and replays.

#include "fake/FakeGpu.hpp"
#include "fake/FakeGpuShared.hpp"
#include "fake/FakeNcclWorld.hpp"

#include <c10/util/Exception.h>

namespace streamnccl::fake {
namespace {

using detail::Lock;

const char* modeName(cudaStreamCaptureMode mode) {
  switch (mode) {
    case cudaStreamCaptureModeGlobal:
      return "global";
    case cudaStreamCaptureModeThreadLocal:
      return "thread_local";
    case cudaStreamCaptureModeRelaxed:
      return "relaxed";
  }
  return "unknown";
}

}  // namespace

bool FakeGpu::unsafeCallAllowed(const char* call) {
  Lock lock(world_->mutex());
  if (!capture_) {
    return true;
  }
  const cudaStreamCaptureMode mode = captureModeOfThread();
  const bool own = capture_->thread == std::this_thread::get_id();
  const bool prohibited =
      own ? mode != cudaStreamCaptureModeRelaxed && capture_->mode != cudaStreamCaptureModeRelaxed
          : mode == cudaStreamCaptureModeGlobal && capture_->mode == cudaStreamCaptureModeGlobal;
  if (!prohibited) {
    return true;
  }
  if (capture_->invalidated.empty()) {
    capture_->invalidated =
        std::string(call) + (own ? " on the capturing thread"
                                 : " from another thread in global capture mode, during a "
                                   "global-mode capture");
  }
  log_.add(std::string(call) +
           " failed: operation not permitted when stream is capturing "
           "(cudaErrorStreamCaptureUnsupported)");
  return false;
}

bool FakeGpu::isCapturing(StreamId stream) const {
  Lock lock(world_->mutex());
  return capturedLocked(stream);
}

bool FakeGpu::capturedLocked(StreamId stream) const {
  return capture_ && capture_->items.count(stream) > 0;
}

void FakeGpu::beginCapture(cudaStreamCaptureMode mode) {
  bindDevice();
  Lock lock(world_->mutex());
  const StreamId origin = currentStream();
  log_.add("cudaStreamBeginCapture(" + name(origin) + ", " + modeName(mode) + ")");
  if (!models().capture) {
    return;
  }
  TORCH_CHECK(!capture_, "streamnccl fake: a capture is under way already");
  capture_ =
      Capture{origin, mode, std::this_thread::get_id(), "", ++poolsMade_, {{origin, 0}}, {}, {}};
  FakeMemory::setAllocationOwner(ownerFor(origin));  // from the graph's pool now
}

std::string FakeGpu::endCapture() {
  Lock lock(world_->mutex());
  log_.add("cudaStreamEndCapture(" + name(currentStream()) + ")");
  if (!models().capture) {
    return "ok";
  }
  TORCH_CHECK(capture_, "streamnccl fake: no capture is under way");
  Capture capture = std::move(*capture_);
  capture_.reset();
  FakeMemory::setAllocationOwner(ownerFor(currentStream()));
  if (!capture.invalidated.empty()) {
    return "invalidated: " + capture.invalidated;
  }
  for (const auto& [streamId, items] : capture.items) {
    if (streamId == capture.origin) {
      continue;
    }
    auto joined = capture.joinedAt.find(streamId);
    if (joined == capture.joinedAt.end() || joined->second < items) {
      return "unjoined: " + name(streamId);
    }
  }
  const int number = graphs_.empty() ? 1 : graphs_.rbegin()->first + 1;
  Graph graph{capture.pool, capture.origin, std::move(capture.captured), {}};
  // NCCL ties every communicator the graph has work on to it, until the graph is destroyed.
  for (const auto& captured : graph.items) {
    if (captured.item.kind == Item::Kind::Nccl) {
      graph.communicators.insert({captured.item.launch->comm, captured.item.launch->rank});
    }
  }
  for (const auto& [comm, rank] : graph.communicators) {
    world_->holdForGraph(comm, rank, +1);
  }
  graphs_[number] = std::move(graph);
  return "ok";
}

void FakeGpu::destroyGraph(int number) {
  Lock lock(world_->mutex());
  auto graph = graphs_.find(number);
  TORCH_CHECK(graph != graphs_.end(), "streamnccl fake: no graph ", number);
  log_.add("cudaGraphDestroy(G" + std::to_string(number) + ")");
  for (const auto& [comm, rank] : graph->second.communicators) {
    world_->holdForGraph(comm, rank, -1);
  }
  graphs_.erase(graph);
}

int FakeGpu::lastGraph() const {
  Lock lock(world_->mutex());
  return graphs_.empty() ? 0 : graphs_.rbegin()->first;
}

void FakeGpu::replay(int number) {
  Lock lock(world_->mutex());
  auto graph = graphs_.find(number);
  TORCH_CHECK(graph != graphs_.end(), "streamnccl fake: no graph ", number);
  const StreamId launch = currentStream();
  log_.add("cudaGraphLaunch(G" + std::to_string(number) + ", " + name(launch) + ")");
  const uint64_t replay = ++replaysMade_;
  // A graph's streams are its own at each replay: its nodes are ordered among themselves,
  // after the launch stream's work so far, and before its work to come, and with nothing
  // else (the captured streams' later work runs beside the replay, as on a GPU).
  const uint64_t entry = stream(launch).enqueued;
  std::map<StreamId, StreamId> own;
  auto ownStream = [&](StreamId captured) {
    auto [found, made] = own.try_emplace(captured, kGraphStreams + ++graphStreamsMade_);
    if (made) {
      Item wait;
      wait.kind = Item::Kind::Wait;
      wait.name = "wait";
      wait.waitStream = launch;
      wait.waitPosition = entry;
      Stream& target = stream(found->second);
      target.pending.push_back(std::move(wait));
      ++target.enqueued;
    }
    return found->second;
  };
  for (const auto& captured : graph->second.items) {
    Item item = captured.item;
    item.replay = replay;
    item.issued = ++issued_;
    if (captured.waitOnCaptured) {
      // The waited-for stream's first item here is its entry wait: counts start after it.
      item.waitStream = ownStream(captured.waitOnCaptured->first);
      item.waitPosition = 1 + captured.waitOnCaptured->second;
    }
    if (item.kind == Item::Kind::Nccl) {
      item.launch = std::make_shared<NcclLaunch>(*item.launch);
      world_->number(*item.launch);
    }
    Stream& target = stream(ownStream(captured.stream));
    target.pending.push_back(std::move(item));
    ++target.enqueued;
  }
  // The launch stream goes on once the graph has: its other streams joined its origin.
  const StreamId origin = ownStream(graph->second.origin);
  Item exit;
  exit.kind = Item::Kind::Wait;
  exit.name = "wait";
  exit.waitStream = origin;
  exit.waitPosition = stream(origin).enqueued;
  push(launch, std::move(exit));
  world_->notify();
}

}  // namespace streamnccl::fake
