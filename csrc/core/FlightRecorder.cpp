#include "core/FlightRecorder.hpp"

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <c10/util/irange.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <algorithm>
#include <array>
#include <map>
#include <sstream>

namespace streamnccl {
namespace {

// The format version of torch 2.11's flight recorder, which the analyzer checks.
constexpr const char* kFormatVersion = "2.10";

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

c10::Dict<c10::IValue, c10::IValue> newDict() {
  return c10::Dict<c10::IValue, c10::IValue>(c10::AnyType::get(), c10::AnyType::get());
}

c10::List<c10::IValue> sizesList(const std::vector<std::vector<int64_t>>& sizes) {
  c10::List<c10::IValue> list(c10::AnyType::get());
  for (const auto& shape : sizes) {
    list.push_back(c10::IValue(shape));
  }
  return list;
}

c10::List<c10::IValue> dtypesList(const std::vector<c10::ScalarType>& dtypes) {
  c10::List<c10::IValue> list(c10::AnyType::get());
  for (const auto dtype : dtypes) {
    list.push_back(c10::IValue(std::string(c10::toString(dtype))));
  }
  return list;
}

std::string rankList(const std::vector<int>& ranks) {
  std::ostringstream out;
  out << "[";
  for (const auto i : c10::irange(ranks.size())) {
    out << (i == 0 ? "" : ", ") << ranks[i];
  }
  out << "]";
  return out.str();
}

}  // namespace

int64_t RecorderClock::nowNs() {
  if (ns_ == 0) {
    ns_ = streamnccl::nowNs();
  }
  return ns_;
}

FlightRecorder& FlightRecorder::instance() {
  // Never destroyed: groups record until the very end of the process.
  static auto* recorder = new FlightRecorder();
  return *recorder;
}

void FlightRecorder::reserve(size_t capacity) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (capacity <= ring_.size()) {
    return;
  }
  // Re-laid out so that every kept entry sits at its id's slot in the larger ring.
  std::vector<Entry> larger(capacity);
  for (auto& entry : ring_) {
    if (entry.id >= 0) {
      larger[entry.id % capacity] = std::move(entry);
    }
  }
  ring_ = std::move(larger);
  enabled_.store(true, std::memory_order_relaxed);
}

bool FlightRecorder::enabled() const { return enabled_.load(std::memory_order_relaxed); }

void FlightRecorder::Tensors::assign(const std::vector<at::Tensor>& tensors) {
  sizes.resize(tensors.size());
  dtypes.resize(tensors.size());
  for (const auto i : c10::irange(tensors.size())) {
    const auto shape = tensors[i].sizes();
    sizes[i].assign(shape.begin(), shape.end());  // within the capacity the slot already has
    dtypes[i] = tensors[i].scalar_type();
  }
}

int64_t FlightRecorder::record(const std::shared_ptr<const RecordedGroup>& group, RecordedOp op,
                               const std::vector<at::Tensor>& inputs,
                               const std::vector<at::Tensor>& outputs, RecorderClock& clock) {
  const int64_t createdNs = clock.nowNs();
  std::lock_guard<std::mutex> lock(mutex_);
  if (ring_.empty()) {
    return -1;
  }
  if (groups_.empty() || groups_.back() != group) {
    if (std::find(groups_.begin(), groups_.end(), group) == groups_.end()) {
      groups_.push_back(group);
    }
  }
  const int64_t id = nextId_++;
  Entry& entry = ring_[id % ring_.size()];
  entry.id = id;
  if (entry.group != group) {  // mostly the same group's entry it replaces: no count to change
    entry.group = group;
  }
  entry.op = std::move(op);
  entry.inputs.assign(inputs);
  entry.outputs.assign(outputs);
  entry.state = State::Scheduled;
  entry.retired = false;
  entry.createdNs = createdNs;
  entry.startedNs = 0;
  entry.completedNs = 0;
  entry.durationMs.reset();
  entry.error.clear();
  return id;
}

FlightRecorder::Entry* FlightRecorder::find(int64_t id) {
  if (id < 0 || ring_.empty()) {
    return nullptr;
  }
  Entry& entry = ring_[id % ring_.size()];
  return entry.id == id ? &entry : nullptr;
}

void FlightRecorder::started(int64_t id) {
  const int64_t now = nowNs();
  std::lock_guard<std::mutex> lock(mutex_);
  if (Entry* entry = find(id); entry && entry->state == State::Scheduled) {
    entry->state = State::Started;
    entry->startedNs = now;
  }
}

void FlightRecorder::completed(int64_t id, std::optional<double> durationMs, RecorderClock& clock) {
  if (id < 0) {
    return;  // not recorded
  }
  const int64_t read = clock.nowNs();
  std::lock_guard<std::mutex> lock(mutex_);
  if (Entry* entry = find(id); entry && !entry->retired) {
    // The clock may have been read for an earlier op of the same pass, before this one's start
    // was seen: it never completes before it started.
    const int64_t now = std::max(read, entry->startedNs);
    if (entry->startedNs == 0) {
      entry->startedNs = now;
    }
    entry->state = State::Completed;
    entry->completedNs = now;
    entry->durationMs = durationMs;
    entry->retired = true;
  }
}

void FlightRecorder::failed(int64_t id, const std::string& error) {
  std::lock_guard<std::mutex> lock(mutex_);
  // The state stays what was seen of the op (scheduled or started): the analyzer reads an op
  // that never completed as the place where the ranks parted.
  if (Entry* entry = find(id); entry && !entry->retired) {
    entry->retired = true;
    entry->error = error;
  }
}

std::vector<const FlightRecorder::Entry*> FlightRecorder::kept(const std::string* groupName) const {
  std::vector<const Entry*> entries;
  for (const auto& entry : ring_) {
    if (entry.id >= 0 && (!groupName || entry.group->name == *groupName)) {
      entries.push_back(&entry);
    }
  }
  std::sort(entries.begin(), entries.end(),
            [](const Entry* a, const Entry* b) { return a->id < b->id; });
  return entries;
}

const char* FlightRecorder::stateName(State state) {
  switch (state) {
    case State::Scheduled:
      return "scheduled";
    case State::Started:
      return "started";
    case State::Completed:
      return "completed";
  }
  return "unknown";
}

c10::Dict<c10::IValue, c10::IValue> FlightRecorder::asDict(const Entry& entry) {
  const RecordedOp& op = entry.op;
  auto dict = newDict();
  dict.insert("record_id", entry.id);
  dict.insert("pg_id", entry.group->uid);
  dict.insert("process_group", c10::ivalue::Tuple::create(entry.group->name, entry.group->desc));
  dict.insert("collective_seq_id", static_cast<int64_t>(op.collectiveSeq));
  dict.insert("p2p_seq_id", static_cast<int64_t>(op.p2pSeq));
  dict.insert("op_id", static_cast<int64_t>(op.opId));
  dict.insert("profiling_name", op.profilingName);
  dict.insert("time_created_ns", entry.createdNs);
  dict.insert("input_sizes", sizesList(entry.inputs.sizes));
  dict.insert("input_dtypes", dtypesList(entry.inputs.dtypes));
  dict.insert("output_sizes", sizesList(entry.outputs.sizes));
  dict.insert("output_dtypes", dtypesList(entry.outputs.dtypes));
  dict.insert("state", std::string(stateName(entry.state)));
  dict.insert("time_discovered_started_ns",
              entry.startedNs ? c10::IValue(entry.startedNs) : c10::IValue());
  dict.insert("time_discovered_completed_ns",
              entry.completedNs ? c10::IValue(entry.completedNs) : c10::IValue());
  dict.insert("retired", entry.retired);
  dict.insert("timeout_ms", static_cast<int64_t>(op.timeout.count()));
  dict.insert("is_p2p", op.p2p);
  if (entry.durationMs) {
    dict.insert("duration_ms", *entry.durationMs);
  }
  if (!entry.error.empty()) {
    dict.insert("error", entry.error);  // streamnccl's own key: why the op failed
  }
  dict.insert("frames", c10::List<c10::IValue>(c10::AnyType::get()));
  return dict;
}

std::string FlightRecorder::dump() const {
  std::lock_guard<std::mutex> lock(mutex_);

  c10::List<c10::IValue> entries(c10::AnyType::get());
  // Per group: the last collective enqueued, started and completed, as torch's pg_status.
  std::map<std::string, std::array<int64_t, 3>> status;
  for (const Entry* entry : kept(nullptr)) {
    const RecordedOp& op = entry->op;
    entries.push_back(asDict(*entry));

    if (!op.p2p) {
      auto& last =
          status.try_emplace(entry->group->name, std::array<int64_t, 3>{-1, -1, -1}).first->second;
      const auto seq = static_cast<int64_t>(op.collectiveSeq);
      last[0] = std::max(last[0], seq);
      if (entry->state != State::Scheduled) {
        last[1] = std::max(last[1], seq);
      }
      if (entry->state == State::Completed) {
        last[2] = std::max(last[2], seq);
      }
    }
  }

  auto pgConfig = newDict();
  for (const auto& group : groups_) {
    auto config = newDict();
    config.insert("name", group->name);
    config.insert("desc", group->desc);
    config.insert("ranks", rankList(group->globalRanks));
    pgConfig.insert(group->name, config);
  }
  auto pgStatus = newDict();
  for (const auto& [name, last] : status) {
    auto dict = newDict();
    dict.insert("last_enqueued_collective", last[0]);
    dict.insert("last_started_collective", last[1]);
    dict.insert("last_completed_collective", last[2]);
    pgStatus.insert(name, dict);
  }

  auto result = newDict();
  result.insert("version", std::string(kFormatVersion));
  result.insert("pg_config", pgConfig);
  result.insert("pg_status", pgStatus);
  result.insert("entries", entries);
  // The plain pickler, as torch's recorder uses: pickle_save() would frame it for torch.load.
  std::vector<char> bytes;
  torch::jit::Pickler pickler(
      [&](const char* data, size_t size) { bytes.insert(bytes.end(), data, data + size); });
  pickler.protocol();
  pickler.pushIValue(c10::IValue(result));
  pickler.stop();
  return std::string(bytes.begin(), bytes.end());
}

std::string FlightRecorder::summary(const std::string& groupName) const {
  constexpr size_t kShown = 5;
  std::lock_guard<std::mutex> lock(mutex_);
  const std::vector<const Entry*> latest = kept(&groupName);
  const size_t first = latest.size() > kShown ? latest.size() - kShown : 0;
  std::ostringstream out;
  out << "last " << latest.size() - first << " ops:";
  for (size_t i = first; i < latest.size(); ++i) {
    const Entry& entry = *latest[i];
    const char* state = entry.error.empty() ? stateName(entry.state) : "failed";
    out << " " << entry.op.profilingName << " #" << entry.op.opId << " " << state
        << (i + 1 < latest.size() ? "," : "");
  }
  return out.str();
}

}  // namespace streamnccl
