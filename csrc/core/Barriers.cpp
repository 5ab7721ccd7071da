// ProcessGroup's barriers: barrier(), a one-element all_reduce on the group's device (or the
// host, where no rank has such a device), and monitored_barrier(), which meets through the
// group's Store (MonitoredBarrier.hpp).

#include "core/Errors.hpp"
#include "core/MonitoredBarrier.hpp"
#include "core/ProcessGroup.hpp"
#include "core/StoreKeys.hpp"
#include "core/StoreWait.hpp"

#include <c10/util/Logging.h>
#include <c10/util/StringUtil.h>
#include <c10/util/irange.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

namespace streamnccl {

namespace {

std::vector<uint8_t> bytes(const std::string& text) { return {text.begin(), text.end()}; }

// Rank 0's verdict for every rank, from every rank's answer ("" where it has such a device):
// "device", "host", or "refused\n<why>" where only some have one.
std::string verdictOf(const std::vector<std::vector<uint8_t>>& answers, const c10::Device& named) {
  std::vector<int> without;
  for (const auto rank : c10::irange(answers.size())) {
    if (!answers[rank].empty()) {
      without.push_back(static_cast<int>(rank));
    }
  }
  if (without.empty()) {
    return "device";
  }
  if (without.size() == answers.size()) {
    return "host";
  }
  const auto& first = answers[without.front()];
  return "refused\nrank(s) " + c10::Join(", ", without) + " have no " + named.str() +
         " where the others have one (rank " + std::to_string(without.front()) + ": " +
         std::string(first.begin(), first.end()) +
         "); a barrier runs on one kind of device on every rank";
}

}  // namespace

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
  const auto timeout = opts.timeout == c10d::kUnsetTimeout ? options_->timeout : opts.timeout;
  const BarrierPlace& place = barrierPlaceFor(named, timeout);
  STREAMNCCL_CHECK_ARG(place.kind != BarrierPlace::Kind::kRefused, "barrier", place.why);
  if (place.kind == BarrierPlace::Kind::kFailed) {
    throwDistBackendError(place.why);
  }
  return place.kind == BarrierPlace::Kind::kHost ? host : named;
}

const ProcessGroup::BarrierPlace& ProcessGroup::barrierPlaceFor(const c10::Device& named,
                                                                std::chrono::milliseconds timeout) {
  using Kind = BarrierPlace::Kind;
  std::lock_guard<std::mutex> lock(barrierPlacesMutex_);
  const auto known = barrierPlaces_.find(named.type());
  if (known != barrierPlaces_.end()) {
    return known->second;
  }
  const auto factory = factories_.find(named.type());
  const std::string mine = factory == factories_.end()
                               ? "this build of streamnccl has no path for it"
                               : factory->second->whyNoDevice().value_or("");
  // Decided by rank 0 from every rank's answer, through the Store: a rank that decided alone
  // could run its barrier on another path than the others and leave them all waiting out the
  // timeout. One key per rank, read by rank 0 only, and one verdict read by the others.
  std::string verdict = verdictOf(std::vector<std::vector<uint8_t>>(getSize(), bytes(mine)), named);
  if (store_) {
    const std::string type = c10::DeviceTypeName(named.type(), true);
    const std::string prefix = keys::barrierPlace(type);
    const std::string verdictKey = prefix + "verdict";
    const auto stop = [this] { refuseIfBroken("barrier"); };
    const std::string within = " within " + std::to_string(timeout.count()) + " ms";
    store_->set(prefix + std::to_string(getRank()), bytes(mine));
    if (getRank() == 0) {
      std::vector<std::string> keys;
      for (const auto rank : c10::irange(getSize())) {
        keys.push_back(prefix + std::to_string(rank));
      }
      try {  // whatever ends rank 0's wait, the others hear it at once
        verdict = keysSetWithin(*store_, keys, timeout, stop)
                      ? verdictOf(store_->multiGet(keys), named)
                      : "failed\n" + who() +
                            " barrier: not every rank reached its first barrier "
                            "naming a " +
                            type + " device" + within;
      } catch (const c10::Error& e) {
        verdict = std::string("failed\n") + e.what_without_backtrace();
      }
      store_->set(verdictKey, bytes(verdict));
    } else {
      if (!keysSetWithin(*store_, {verdictKey}, timeout, stop)) {
        throwDistBackendError(who() + " barrier: rank 0 did not say where barriers naming a " +
                              type + " device run" + within +
                              " (it has not reached its first one)");
      }
      const auto got = store_->get(verdictKey);
      verdict.assign(got.begin(), got.end());
    }
  }
  BarrierPlace place;
  const auto newline = verdict.find('\n');
  const std::string kind = verdict.substr(0, newline);
  place.why = newline == std::string::npos ? "" : verdict.substr(newline + 1);
  place.kind = kind == "device"    ? Kind::kDevice
               : kind == "host"    ? Kind::kHost
               : kind == "refused" ? Kind::kRefused
                                   : Kind::kFailed;
  if (place.kind == Kind::kHost) {
    LOG(WARNING) << who() << " barrier: there is no " << named << " (" << mine
                 << "), on any rank; barriers naming one run on the host instead, as gloo's "
                    "do";
  }
  return barrierPlaces_.emplace(named.type(), std::move(place)).first->second;
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::barrier(const c10d::BarrierOptions& opts) {
  constexpr const char* op = "barrier";
  refuseIfBroken(op);  // at once, before any agreement with the other ranks
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
                {[token](Transport& comm, Kernels&, c10::Stream stream) {
                   comm.allReduce(token, token, ReduceKind::Sum, stream);
                 },
                 nullptr});
}

void ProcessGroup::monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) {
  TORCH_CHECK(store_, "streamnccl: monitored_barrier needs the group's Store");
  const auto timeout = opts.timeout == c10d::kUnsetTimeout ? options_->timeout : opts.timeout;
  auto store =
      c10::make_intrusive<c10d::PrefixStore>(keys::monitoredBarrier(monitoredBarriers_++), store_);
  streamnccl::monitoredBarrier(*store, getRank(), getSize(), timeout, waitAllRanks, who(),
                               [this] { refuseIfBroken("monitored_barrier"); });
}

}  // namespace streamnccl
