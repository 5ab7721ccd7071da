#pragma once

// How a break on one rank reaches every rank of the group (Options::propagateErrors).
//
// A group's board is a few keys in its Store. The rank whose group breaks first posts the break
// (its rank and its error) there; every rank's watcher (BreakWatcher.hpp, one thread per
// process) looks at the boards of its groups a few times a second, and a rank that finds a
// break posted breaks its own group with it, whatever its own timeout. Posting and looking are
// Store requests off the ops' path: a group that never breaks pays only the look.
//
// A rank that dies posts nothing, and the ranks that see its connection close learn only that
// something went: so every rank that breaks, from its own fault or from the post, answers a roll
// call on the board and waits (up to kRollCall) for the others' answers before its ops fail.
// The ranks that have not answered by then, dead or stuck, are named in every rank's error.
//
// The board is claimed anew by each incarnation of a group (a group made again under the same
// Store prefix, after destroy_process_group): a break posted by an earlier one is not this one's.
// Every board of the process talks through one clone of the Store under its group's prefixes
// (a TCPStore's clone: a connection of the boards' own), so that a request of a group's,
// blocked waiting for a key, does not hold up the watcher, nor the watcher the group, and a
// process of many groups opens one connection for them, not one each. A Store that cannot be
// reached is said once; the group then ends at its own timeout, as without propagation.

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace streamnccl {

class BreakBoard {
 public:
  // How long a rank that broke waits for every rank to answer the roll call: a rank whose group
  // broke too answers at once, any other within a period of its watcher (BreakWatcher's
  // kPeriod, 200 ms); three periods leave one whose watcher runs late the time to. Every
  // failure waits this long where a rank is gone, and no longer: the price of naming it.
  static constexpr std::chrono::milliseconds kRollCall{600};

  // A break as posted: the rank it broke on first, and its error.
  struct Post {
    int rank = -1;
    std::string what;
  };
  // What a rank that broke knows once the roll call is over.
  struct News {
    std::optional<Post> first;  // the break that was posted first (null: the Store unreachable)
    std::vector<int> silent;    // the ranks that had not answered
  };

  // The board of a group of `size` whose rank here is `rank`, in `store`, claimed for this
  // incarnation of the group (one Store request, made here, by every rank as it makes the
  // group). `who` names the group in the log. Null when the Store cannot be reached (said).
  static std::shared_ptr<BreakBoard> open(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                          int size, std::string who);

  // The group broke here. `ownError`: its error, posted unless another rank posted first;
  // nullopt when the break was learned from the board (nothing to post). Then this rank answers
  // the roll call and, with `rollCall`, waits up to kRollCall for every rank's answer. Once per
  // board: a later call returns what the first found. Never throws.
  News announce(const std::optional<std::string>& ownError, bool rollCall = true);
  // The watcher's look: the break another rank posted, once there is one; nullopt otherwise,
  // and for good after announce() or once the Store is found unreachable.
  std::optional<Post> look();
  // The group has ended: look() stops asking.
  void close() { closed_.store(true); }
  bool closed() const { return closed_.load(); }
  // The watcher keeps what look() found here, for the group's watchdog to take: the group
  // breaks on its own thread, beside the other groups', not on the watcher's.
  void posted(const Post& post);
  std::optional<Post> takePosted();

  int rank() const { return rank_; }
  // "the group broke on rank 3: ..." ("broke first on", with `when` "first") and "; rank 3 did
  // not answer ...", for errors.
  static std::string describe(const Post& post, const std::string& when = "");
  static std::string describeSilent(const std::vector<int>& silent);

  BreakBoard(c10::intrusive_ptr<c10d::Store> store, std::string prefix, int rank, int size,
             std::string who);

 private:
  // Logs a Store failure while doing `what`, once; look() then stops asking.
  void unreachable(const char* what, const std::exception& error);
  std::vector<int> awaitAnswers();

  const c10::intrusive_ptr<c10d::Store> store_;
  const std::string firstKey_;
  const std::string answersKey_;
  const int rank_;
  const int size_;
  const std::string who_;

  std::mutex mutex_;  // one announce() at a time; the others wait for its news
  std::optional<News> news_;
  std::atomic<bool> done_{false};    // announced, or the Store unreachable: look() stops asking
  std::atomic<bool> said_{false};    // the Store's failure was logged
  std::atomic<bool> closed_{false};  // the group has ended
  std::mutex postedMutex_;
  std::optional<Post> posted_;
  std::atomic<bool> hasPosted_{false};  // posted_ is set: the watchdog's every look is a load
};

}  // namespace streamnccl
