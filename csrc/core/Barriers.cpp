// ProcessGroup's barriers: barrier(), a one-element all_reduce on the group's device (or the
// host, where no rank has such a device), and monitored_barrier(), which meets through the
// group's Store (MonitoredBarrier.hpp).

#include "core/MonitoredBarrier.hpp"
#include "core/ProcessGroup.hpp"

#include "core/Errors.hpp"

#include <c10/util/Logging.h>
#include <c10/util/StringUtil.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>

namespace streamnccl {

c10::Device ProcessGroup::barrierDevice(const c10d::BarrierOptions& opts) {
  const c10::Device host(c10::kCPU);
  const c10::Device named = [&] {
    if (!opts.device_ids.empty()) {
      return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(opts.device_ids.front()));
    }
    if (opts.device) {
      return *opts.device;
    }
    if (auto bound = getBoundDeviceId()) {
      return *bound;
    }
    std::lock_guard<std::mutex> lock(lastDeviceMutex_);
    return lastAcceleratorDevice_.value_or(host);
  }();
  if (named.is_cpu()) {
    return host;
  }
  const BarrierPlace& place = barrierPlaceFor(named);
  STREAMNCCL_CHECK_ARG(place.refusal.empty(), "barrier", place.refusal);
  return place.onHost ? host : named;
}

const ProcessGroup::BarrierPlace& ProcessGroup::barrierPlaceFor(const c10::Device& named) {
  std::lock_guard<std::mutex> lock(barrierPlacesMutex_);
  const auto known = barrierPlaces_.find(named.type());
  if (known != barrierPlaces_.end()) {
    return known->second;
  }
  const auto factory = factories_.find(named.type());
  const std::string mine = factory == factories_.end()
                               ? "this build of streamnccl has no path for it"
                               : factory->second->whyNoDevice().value_or("");
  // Every rank's answer ("" where it has such a device), through the Store: a rank that
  // decided alone could run its barrier on another path than the others and leave them all
  // waiting out the timeout.
  std::vector<std::string> answers(getSize(), mine);
  if (store_) {
    const std::string prefix =
        "streamnccl/barrier_place/" + c10::DeviceTypeName(named.type(), true) + "/";
    std::vector<std::string> keys;
    for (int rank = 0; rank < getSize(); ++rank) {
      keys.push_back(prefix + std::to_string(rank));
    }
    store_->set(keys[getRank()], std::vector<uint8_t>(mine.begin(), mine.end()));
    try {
      store_->wait(keys, options_->timeout);
    } catch (const c10::Error& e) {
      throwDistBackendError(who() + " barrier: not every rank reached its first barrier naming a " +
                            c10::DeviceTypeName(named.type(), true) + " device within " +
                            std::to_string(options_->timeout.count()) + " ms (" +
                            e.what_without_backtrace() + ")");
    }
    const auto values = store_->multiGet(keys);
    std::transform(
        values.begin(), values.end(), answers.begin(),
        [](const std::vector<uint8_t>& value) { return std::string(value.begin(), value.end()); });
  }
  std::vector<int> without;
  for (int rank = 0; rank < getSize(); ++rank) {
    if (!answers[rank].empty()) {
      without.push_back(rank);
    }
  }
  BarrierPlace place;
  if (static_cast<int>(without.size()) == getSize()) {
    place.onHost = true;
    LOG(WARNING) << who() << " barrier: there is no " << named << " (" << mine
                 << "), on any rank; barriers naming one run on the host instead, as gloo's "
                    "do";
  } else if (!without.empty()) {
    place.refusal = "rank(s) " + c10::Join(", ", without) + " have no " + named.str() +
                    " where the others have one (rank " + std::to_string(without.front()) + ": " +
                    answers[without.front()] +
                    "); a barrier runs on one kind of device on every rank";
  }
  return barrierPlaces_.emplace(named.type(), std::move(place)).first->second;
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::barrier(const c10d::BarrierOptions& opts) {
  constexpr const char* op = "barrier";
  // A one-element allreduce on the group's device, whose Work blocks the host on wait():
  // barrier() is a host synchronisation point even where collectives are stream-ordered.
  const c10::Device device = barrierDevice(opts);
  Path& path = pathFor(device, op);
  Kernels callers(*path.device);
  const at::Tensor token = callers.zeros({1}, at::TensorOptions().device(device).dtype(at::kFloat));
  return launch({op,
                 c10d::OpType::BARRIER,
                 token,
                 {token},
                 {token},
                 /*async=*/true,
                 opts.timeout,
                 /*blockHostOnWait=*/true},
                path,
                {[token](Communicator& comm, Kernels&, c10::Stream stream) {
                   comm.allReduce(token, token, ReduceKind::Sum, stream);
                 },
                 nullptr});
}

void ProcessGroup::monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) {
  TORCH_CHECK(store_, "streamnccl: monitored_barrier needs the group's Store");
  const auto timeout = opts.timeout == c10d::kUnsetTimeout ? options_->timeout : opts.timeout;
  auto store = c10::make_intrusive<c10d::PrefixStore>(
      "streamnccl/monitored_barrier/" + std::to_string(monitoredBarriers_++) + "/", store_);
  streamnccl::monitoredBarrier(*store, getRank(), getSize(), timeout, waitAllRanks, who(),
                               [this] { refuseIfBroken("monitored_barrier"); });
}

}  // namespace streamnccl
