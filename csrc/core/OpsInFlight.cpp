#include "core/OpsInFlight.hpp"

#include <c10/util/Exception.h>

#include <algorithm>

namespace streamnccl {

OpsInFlight::StreamOf* OpsInFlight::streamOf(const Work& work) {
  const Work::EndStream end = work.endStream();
  return std::find_if(streams_.begin(), streams_.end(),
                      [&](const StreamOf& s) { return s.end == end; });
}

void OpsInFlight::add(c10::intrusive_ptr<Work> work) {
  if (auto* stream = streamOf(*work); stream != streams_.end()) {
    ++stream->ops;
  } else {
    streams_.push_back(StreamOf{work->endStream(), 1});
  }
  ops_.push_back(std::move(work));
}

void OpsInFlight::countOut(const Work& work) {
  auto* stream = streamOf(work);
  TORCH_INTERNAL_ASSERT(stream != streams_.end(), "streamnccl: an op not counted in");
  if (--stream->ops == 0) {
    streams_.erase(stream);
  }
}

void OpsInFlight::look(Look how, Leaves leaves) {
  // A whole look skips nothing: two ops launched at once from two threads onto one stream may
  // be added the other way round, and the later one may then have ended behind a running one.
  const bool launch = how == Look::UntilEachStreamRuns;
  c10::SmallVector<Work::EndStream, 4> running;  // a stream met with an op still running
  const auto behindRunning = [&](const Work& work) {
    const Work::EndStream end = work.endStream();
    return end.stream && std::find(running.begin(), running.end(), end) != running.end();
  };
  size_t looked = 0;
  for (; looked < ops_.size() && !(launch && running.size() == streams_.size()); ++looked) {
    auto& work = ops_[looked];
    if (launch && behindRunning(*work)) {
      continue;
    }
    const Work& op = *work;  // `leaves` moves the op out of its place
    if (!leaves(work)) {
      if (launch) {
        running.push_back(op.endStream());
      }
      continue;
    }
    countOut(op);
  }
  // The ops kept among those looked at close up towards the ones not looked at; the nulls left
  // in front go.
  size_t kept = looked;
  for (size_t i = looked; i-- > 0;) {
    if (ops_[i]) {
      auto& to = ops_[--kept];
      if (&to != &ops_[i]) {
        to = std::move(ops_[i]);
      }
    }
  }
  ops_.erase(ops_.begin(), ops_.begin() + static_cast<std::ptrdiff_t>(kept));
}

void OpsInFlight::takeWhere(c10::function_ref<bool(Work&)> take, Works& to) {
  auto kept = ops_.begin();
  for (auto& work : ops_) {
    if (take(*work)) {
      countOut(*work);
      to.push_back(std::move(work));
    } else {
      *kept++ = std::move(work);
    }
  }
  ops_.erase(kept, ops_.end());
}

OpsInFlight::Works OpsInFlight::takeAll() {
  Works taken(std::make_move_iterator(ops_.begin()), std::make_move_iterator(ops_.end()));
  ops_.clear();
  streams_.clear();
  return taken;
}

}  // namespace streamnccl
