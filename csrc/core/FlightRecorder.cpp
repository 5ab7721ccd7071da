#include "core/FlightRecorder.hpp"

#include <c10/util/irange.h>

#include <sstream>

namespace streamnccl {
namespace {

const char* stateName(FlightRecorder::State state) {
  switch (state) {
    case FlightRecorder::State::Queued:
      return "queued";
    case FlightRecorder::State::Started:
      return "started";
    case FlightRecorder::State::Completed:
      return "completed";
    case FlightRecorder::State::Failed:
      return "failed";
  }
  return "unknown";
}

std::string jsonString(const std::string& text) {
  std::ostringstream out;
  out << '"';
  for (const char c : text) {
    switch (c) {
      case '"':
        out << "\\\"";
        break;
      case '\\':
        out << "\\\\";
        break;
      case '\n':
        out << "\\n";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out << ' ';
        } else {
          out << c;
        }
    }
  }
  out << '"';
  return out.str();
}

double millisecondsBetween(std::chrono::steady_clock::time_point from,
                           std::chrono::steady_clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

}  // namespace

void FlightRecorder::queued(const OpInfo& info) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (capacity_ == 0) {
    return;
  }
  if (records_.size() == capacity_) {
    records_.pop_front();
  }
  records_.push_back(Record{info, State::Queued, std::chrono::steady_clock::now(), {}, {}, {}});
}

FlightRecorder::Record* FlightRecorder::find(uint64_t seq) {
  // Recent ops are looked up far more often than old ones.
  for (auto it = records_.rbegin(); it != records_.rend(); ++it) {
    if (it->info.seq == seq) {
      return &*it;
    }
  }
  return nullptr;
}

void FlightRecorder::started(uint64_t seq) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (Record* record = find(seq); record && record->state == State::Queued) {
    record->state = State::Started;
    record->startedAt = std::chrono::steady_clock::now();
  }
}

void FlightRecorder::completed(uint64_t seq) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (Record* record = find(seq); record && record->state != State::Failed) {
    record->state = State::Completed;
    record->endedAt = std::chrono::steady_clock::now();
  }
}

void FlightRecorder::failed(uint64_t seq, const std::string& error) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (Record* record = find(seq); record && record->state != State::Failed) {
    record->state = State::Failed;
    record->endedAt = std::chrono::steady_clock::now();
    record->error = error;
  }
}

std::string FlightRecorder::toJson(const OpInfo& group, const std::string& cause) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::ostringstream out;
  out << "{\n  \"rank\": " << group.rank << ",\n  \"size\": " << group.size
      << ",\n  \"group\": " << jsonString(group.group) << ",\n  \"cause\": " << jsonString(cause)
      << ",\n  \"ops\": [";
  for (const auto i : c10::irange(records_.size())) {
    const Record& record = records_[i];
    out << (i == 0 ? "\n" : ",\n") << "    {\"seq\": " << record.info.seq
        << ", \"op\": " << jsonString(record.info.name) << ", \"shape\": [";
    for (const auto d : c10::irange(record.info.shape.size())) {
      out << (d == 0 ? "" : ", ") << record.info.shape[d];
    }
    out << "], \"dtype\": " << jsonString(c10::toString(record.info.dtype))
        << ", \"state\": " << jsonString(stateName(record.state))
        << ", \"queued_at_ms\": " << millisecondsBetween(origin_, record.queuedAt);
    if (record.state == State::Completed || record.state == State::Failed) {
      out << ", \"duration_ms\": " << millisecondsBetween(record.queuedAt, record.endedAt);
    }
    if (!record.error.empty()) {
      out << ", \"error\": " << jsonString(record.error);
    }
    out << "}";
  }
  out << "\n  ]\n}\n";
  return out.str();
}

std::string FlightRecorder::summary() const {
  std::lock_guard<std::mutex> lock(mutex_);
  constexpr size_t kShown = 5;
  std::ostringstream out;
  out << "last " << std::min(kShown, records_.size()) << " of " << records_.size() << " ops:";
  const size_t first = records_.size() > kShown ? records_.size() - kShown : 0;
  for (size_t i = first; i < records_.size(); ++i) {
    out << " " << records_[i].info.name << " #" << records_[i].info.seq << " "
        << stateName(records_[i].state) << (i + 1 < records_.size() ? "," : "");
  }
  return out.str();
}

}  // namespace streamnccl
