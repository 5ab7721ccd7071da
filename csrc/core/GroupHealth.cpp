#include "core/GroupHealth.hpp"

#include "core/Errors.hpp"

#include <c10/util/Logging.h>

#include <cstdio>
#include <fstream>

namespace streamnccl {
GroupHealth::GroupHealth(size_t recorderCapacity, std::optional<std::string> dumpDir,
                         int globalRank)
    : dumpDir_(std::move(dumpDir)), globalRank_(globalRank) {
  recorder().reserve(recorderCapacity);
}

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
    // Written whole under another name first: a reader never sees half a dump.
    const std::string path = *dumpDir_ + "/" + kDumpPrefix + std::to_string(globalRank_.load());
    // (A name without the prefix: torchfrtrace reads every file whose name holds it.)
    const std::string partial = *dumpDir_ + "/.writing_rank_" + std::to_string(globalRank_.load());
    {
      std::ofstream file(partial, std::ios::binary);
      file << recorder().dump();
    }
    where =
        std::rename(partial.c_str(), path.c_str()) == 0 ? path : "could not be written to " + path;
  }
  LOG(ERROR) << group.who() << " group broken: " << cause << "; " << recorder().summary(group.group)
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
