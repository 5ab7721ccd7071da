#include "fake/CallLog.hpp"

#include <algorithm>
#include <utility>

namespace streamnccl::fake {

void CallLog::add(std::string call) {
  if (!recording_.load(std::memory_order_relaxed)) {
    return;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  calls_.push_back(std::move(call));
}

std::vector<std::string> CallLog::calls() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return calls_;
}

void CallLog::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  calls_.clear();
  buffers_.clear();
}

void CallLog::addBuffers(BufferRecord record) {
  if (!recording_.load(std::memory_order_relaxed)) {
    return;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  buffers_.push_back(std::move(record));
}

std::vector<BufferRecord> CallLog::buffers() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return buffers_;
}

void CallLog::violation(std::string what) {
  std::lock_guard<std::mutex> lock(mutex_);
  violations_.push_back(std::move(what));
}

std::vector<std::string> CallLog::takeViolations() {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::exchange(violations_, {});
}

void CallLog::failNext(std::string function) {
  std::lock_guard<std::mutex> lock(mutex_);
  failing_.push_back(std::move(function));
}

bool CallLog::takeFailure(const std::string& function) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = std::find(failing_.begin(), failing_.end(), function);
  if (found == failing_.end()) {
    return false;
  }
  failing_.erase(found);
  return true;
}

void CallLog::inProgressNext(std::string function, int polls) {
  std::lock_guard<std::mutex> lock(mutex_);
  inProgress_[std::move(function)] = polls;
}

int CallLog::takeInProgress(const std::string& function) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = inProgress_.find(function);
  if (found == inProgress_.end()) {
    return 0;
  }
  const int polls = found->second;
  inProgress_.erase(found);
  return polls;
}

}  // namespace streamnccl::fake
