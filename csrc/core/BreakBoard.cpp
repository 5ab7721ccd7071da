#include "core/BreakBoard.hpp"

#include "core/StoreKeys.hpp"

#include <c10/util/Logging.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <set>
#include <thread>

namespace streamnccl {
namespace {

constexpr auto kAnswersPeriod = std::chrono::milliseconds(20);

std::vector<uint8_t> bytesOf(const std::string& text) { return {text.begin(), text.end()}; }
std::string textOf(const std::vector<uint8_t>& bytes) { return {bytes.begin(), bytes.end()}; }

// "<rank>\n<error>", as posted.
BreakBoard::Post parsePost(const std::string& text) {
  BreakBoard::Post post;
  const size_t newline = text.find('\n');
  try {
    post.rank = std::stoi(text.substr(0, newline));
  } catch (const std::exception&) {
    post.rank = -1;  // not a board of ours: said as it is
  }
  post.what = newline == std::string::npos ? text : text.substr(newline + 1);
  return post;
}

// The prefix a PrefixStore puts before its keys (c10d keeps it protected: read through a
// pointer to the member, taken where it is accessible).
struct PrefixOf : c10d::PrefixStore {
  static const std::string& of(const c10d::PrefixStore& store) {
    return store.*(&PrefixOf::prefix_);
  }
};

// The Store under every PrefixStore of a group's, cloned once per process: every board on it
// shares one connection of the boards' own (a TCPStore's clone), apart from the one the groups'
// requests use, and a process with many groups opens one, not one a group.
c10::intrusive_ptr<c10d::Store> boardsConnectionTo(const c10::intrusive_ptr<c10d::Store>& base) {
  struct Cloned {
    c10::weak_intrusive_ptr<c10d::Store> base;  // weakly: a Store torch let go of can go
    c10::intrusive_ptr<c10d::Store> clone;
  };
  static auto* mutex = new std::mutex();  // never destroyed: boards may open during exit
  static auto* cloned = new std::vector<Cloned>();
  std::lock_guard<std::mutex> lock(*mutex);
  cloned->erase(std::remove_if(cloned->begin(), cloned->end(),
                               [](const Cloned& one) { return one.base.expired(); }),
                cloned->end());
  for (const Cloned& one : *cloned) {
    if (one.base.lock() == base) {
      return one.clone;
    }
  }
  c10::intrusive_ptr<c10d::Store> clone;
  try {
    clone = base->clone();  // an in-process Store's clone is itself
  } catch (const std::exception&) {
  }
  if (!clone) {
    return base;  // a Store written in Python: shared with the groups' requests
  }
  cloned->push_back(Cloned{c10::weak_intrusive_ptr<c10d::Store>(base), clone});
  return clone;
}

// The group's Store, through the boards' connection: the same keys, under the same prefixes.
// The board asks only for keys that are there, so its requests never wait.
c10::intrusive_ptr<c10d::Store> boardsView(const c10::intrusive_ptr<c10d::Store>& store) {
  std::vector<std::string> prefixes;  // outermost first
  c10::intrusive_ptr<c10d::Store> base = store;
  while (auto* prefixed = dynamic_cast<c10d::PrefixStore*>(base.get())) {
    prefixes.push_back(PrefixOf::of(*prefixed));
    base = prefixed->getUnderlyingStore();
  }
  c10::intrusive_ptr<c10d::Store> view = boardsConnectionTo(base);
  for (auto prefix = prefixes.rbegin(); prefix != prefixes.rend(); ++prefix) {
    view = c10::make_intrusive<c10d::PrefixStore>(*prefix, view);
  }
  return view;
}

}  // namespace

std::shared_ptr<BreakBoard> BreakBoard::open(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                             int size, std::string who) {
  try {
    auto own = boardsView(store);
    // Every rank of an incarnation adds one: the n-th incarnation's ranks read n*size+1 to
    // (n+1)*size, whatever their order. Counted per size, so that groups of other sizes made
    // under the same prefix (a Store the caller reuses) do not shift the count.
    const int64_t count = own->add(keys::breaks() + "made-of-" + std::to_string(size), 1);
    const std::string prefix =
        keys::breaks() + std::to_string(size) + "/" + std::to_string((count - 1) / size) + "/";
    return std::make_shared<BreakBoard>(std::move(own), prefix, rank, size, std::move(who));
  } catch (const std::exception& e) {
    LOG(WARNING) << who << " cannot reach the Store to share breaks with the other ranks ("
                 << e.what() << "): a break elsewhere reaches this rank at its own timeout";
    return nullptr;
  }
}

BreakBoard::BreakBoard(c10::intrusive_ptr<c10d::Store> store, std::string prefix, int rank,
                       int size, std::string who)
    : store_(std::move(store)),
      firstKey_(prefix + "first"),
      answersKey_(prefix + "answers"),
      rank_(rank),
      size_(size),
      who_(std::move(who)) {}

void BreakBoard::posted(const Post& post) {
  std::lock_guard<std::mutex> lock(postedMutex_);
  if (!posted_) {
    posted_ = post;
    hasPosted_.store(true, std::memory_order_release);
  }
}

std::optional<BreakBoard::Post> BreakBoard::takePosted() {
  if (!hasPosted_.load(std::memory_order_acquire)) {
    return std::nullopt;
  }
  std::lock_guard<std::mutex> lock(postedMutex_);
  hasPosted_.store(false, std::memory_order_release);
  return std::exchange(posted_, std::nullopt);
}

std::optional<BreakBoard::Post> BreakBoard::look() {
  if (done_.load() || closed_.load() || hasPosted_.load()) {
    return std::nullopt;
  }
  try {
    if (!store_->check({firstKey_})) {
      return std::nullopt;
    }
    Post post = parsePost(textOf(store_->get(firstKey_)));
    if (post.rank == rank_) {
      return std::nullopt;  // this rank's own, announced meanwhile
    }
    return post;
  } catch (const std::exception& e) {
    unreachable("looking for breaks posted by other ranks", e);
    return std::nullopt;
  }
}

BreakBoard::News BreakBoard::announce(const std::optional<std::string>& ownError, bool rollCall) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (news_) {
    return *news_;
  }
  done_.store(true);
  News news;
  try {
    if (ownError) {
      // The first to post stays: a later poster reads it back instead.
      const std::string mine = std::to_string(rank_) + "\n" + *ownError;
      news.first = parsePost(textOf(store_->compareSet(firstKey_, {}, bytesOf(mine))));
    } else {
      news.first = parsePost(textOf(store_->get(firstKey_)));
    }
    store_->append(answersKey_, bytesOf(std::to_string(rank_) + ","));
    if (rollCall) {
      news.silent = awaitAnswers();
    }
  } catch (const std::exception& e) {
    news.first.reset();
    news.silent.clear();
    unreachable("posting this rank's break for the other ranks", e);
  }
  news_ = news;
  return news;
}

std::vector<int> BreakBoard::awaitAnswers() {
  const auto deadline = std::chrono::steady_clock::now() + kRollCall;
  while (true) {
    std::set<int> answered;
    const std::string answers = textOf(store_->get(answersKey_));
    size_t from = 0;
    for (size_t comma; (comma = answers.find(',', from)) != std::string::npos; from = comma + 1) {
      answered.insert(std::atoi(answers.substr(from, comma - from).c_str()));
    }
    std::vector<int> silent;
    for (int rank = 0; rank < size_; ++rank) {
      if (answered.count(rank) == 0) {
        silent.push_back(rank);
      }
    }
    if (silent.empty() || std::chrono::steady_clock::now() >= deadline) {
      return silent;
    }
    std::this_thread::sleep_for(kAnswersPeriod);
  }
}

void BreakBoard::unreachable(const char* what, const std::exception& error) {
  done_.store(true);
  if (said_.exchange(true)) {
    return;
  }
  LOG(WARNING) << who_ << " cannot reach the Store " << what << " (" << error.what()
               << "): this group's ops end at their own timeout";
}

std::string BreakBoard::describe(const Post& post, const std::string& when) {
  return "the group broke " + (when.empty() ? "" : when + " ") + "on rank " +
         std::to_string(post.rank) + ": " + post.what;
}

std::string BreakBoard::describeSilent(const std::vector<int>& silent) {
  if (silent.empty()) {
    return {};
  }
  std::string ranks;
  for (const int rank : silent) {
    ranks += (ranks.empty() ? "" : ", ") + std::to_string(rank);
  }
  return std::string("; ") + (silent.size() == 1 ? "rank " : "ranks ") + ranks +
         " did not answer the group's roll call within " + std::to_string(kRollCall.count()) +
         " ms (gone, or stuck outside streamnccl)";
}

}  // namespace streamnccl
