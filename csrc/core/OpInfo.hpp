#pragma once

#include <c10/core/ScalarType.h>
#include <c10/util/SmallVector.h>
#include <c10/util/irange.h>

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

namespace streamnccl {

// What messages say about one op: `[streamnccl rank r/n pg=name] OP #seq (shape, dtype)`.
struct OpInfo {
  const char* name = "";
  uint64_t seq = 0;
  int rank = 0;
  int size = 0;
  std::string group;
  c10::SmallVector<int64_t, 6> shape;  // inline: made for every op
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  int64_t traceId = -1;  // its flight recorder entry (FlightRecorder::record), -1 if none
  std::string path;      // the lane it runs on (Path::description), empty on the group's

  // "[streamnccl rank r/n pg=name]": the group and rank, as every message names them.
  std::string who() const {
    return "[streamnccl rank " + std::to_string(rank) + "/" + std::to_string(size) +
           " pg=" + group + "]";
  }

  std::string describe() const {
    std::ostringstream out;
    out << who() << " " << name << " #" << seq << " ([";
    for (const auto i : c10::irange(shape.size())) {
      out << (i == 0 ? "" : ", ") << shape[i];
    }
    out << "], " << c10::toString(dtype) << ")";
    return out.str();
  }
};

}  // namespace streamnccl
