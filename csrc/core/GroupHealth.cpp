#include "core/GroupHealth.hpp"

#include "core/Errors.hpp"

#include <c10/util/Logging.h>

#include <fstream>

namespace streamnccl {
GroupHealth::GroupHealth(size_t recorderCapacity, std::optional<std::string> dumpDir)
    : recorder_(recorderCapacity), dumpDir_(std::move(dumpDir)) {}

bool GroupHealth::breakWith(const OpInfo& group, std::exception_ptr error) {
  std::string cause = describeException(error);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (broken_) {
      return false;
    }
    broken_ = error;
    cause_ = cause;
    brokenFlag_.store(true, std::memory_order_release);
  }
  std::string where = "not written (set STREAMNCCL_DUMP_DIR or Options(dump_dir=...))";
  if (dumpDir_) {
    const std::string path =
        *dumpDir_ + "/streamnccl_rank" + std::to_string(group.rank) + "_pg" + group.group + ".json";
    std::ofstream file(path);
    file << recorder_.toJson(group, cause);
    where = file ? path : "could not be written to " + path;
  }
  LOG(ERROR) << group.who() << " group broken: " << cause << "; " << recorder_.summary()
             << "; flight recorder " << where;
  return true;
}

void GroupHealth::raiseIfBroken(const OpInfo& group, const char* op) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (broken_) {
    throwDistBackendError(group.who() + " " + op +
                          ": the group is unusable since an earlier failure: " + cause_);
  }
}

}  // namespace streamnccl
