#pragma once

// Which threads are a group's own: a host stream's worker and a watchdog, and a Gloo thread
// while it drives a host stream (GroupThreadScope). User code runs on
// them (an op's future callbacks), and may let go of the last reference to a group there, or
// shut a group down. That group's teardown must not run on such a thread: it waits for the
// group's ops and joins the group's threads, among them the very thread it would run on. It
// runs on a thread of its own instead (ProcessGroup::close()).

namespace streamnccl {

namespace detail {
inline thread_local bool onGroupThread = false;
}  // namespace detail

// Called first thing by a thread a group runs.
inline void markGroupThread() { detail::onGroupThread = true; }

// Whether the calling thread is one that some group runs.
inline bool onGroupThread() { return detail::onGroupThread; }

// Marks the calling thread a group's for the scope's life: a thread of another's (Gloo's) that
// runs a group's work (an op's future callbacks) meanwhile.
class GroupThreadScope {
 public:
  GroupThreadScope() : was_(detail::onGroupThread) { detail::onGroupThread = true; }
  ~GroupThreadScope() { detail::onGroupThread = was_; }
  GroupThreadScope(const GroupThreadScope&) = delete;
  GroupThreadScope& operator=(const GroupThreadScope&) = delete;

 private:
  bool was_;
};

}  // namespace streamnccl
