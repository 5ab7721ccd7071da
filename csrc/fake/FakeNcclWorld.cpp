#include "fake/FakeNcclWorld.hpp"

#include "fake/FakeCollectives.hpp"
#include "fake/FakeGpu.hpp"

#include <c10/util/Exception.h>

#include <cstring>
#include <deque>

namespace streamnccl::fake {

FakeNcclWorld::FakeNcclWorld(bool simulatePeers, FakeModels models)
    : simulatePeers_(simulatePeers), models_(models) {
  if (models_.progress) {
    engine_ = std::thread([this] { loop(); });
  }
}

FakeNcclWorld::~FakeNcclWorld() {
  {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (engine_.joinable()) {
    engine_.join();
  }
}

void FakeNcclWorld::addGpu(FakeGpu* gpu) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  gpus_.insert(gpu);
}

void FakeNcclWorld::removeGpu(FakeGpu* gpu) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  gpus_.erase(gpu);
  for (auto& [key, meeting] : meetings_) {
    for (auto member = meeting.gpus.begin(); member != meeting.gpus.end();) {
      member = member->second == gpu ? meeting.gpus.erase(member) : std::next(member);
    }
  }
}

ncclUniqueId FakeNcclWorld::newId() {
  ncclUniqueId id{};
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  const uint64_t key = ++idsMade_;
  std::memcpy(id.internal, &key, sizeof(key));
  return id;
}

uint64_t FakeNcclWorld::keyOf(const ncclUniqueId& id) {
  uint64_t key = 0;
  std::memcpy(&key, id.internal, sizeof(key));
  return key;
}

uint64_t FakeNcclWorld::shrunkKey(uint64_t parent, int nth, const std::vector<int>& excluded) {
  uint64_t key = parent * 1000003 + static_cast<uint64_t>(nth) + 1;
  for (const int rank : excluded) {
    key = key * 31 + static_cast<uint64_t>(rank) + 1;
  }
  return key | (uint64_t{1} << 63);  // unique ids count up from 1
}

void FakeNcclWorld::joinSplit(uint64_t parent, int nth, int rank, int nranks, int color, int key) {
  {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    SplitMeeting& split = splits_[{parent, nth}];
    split.nranks = nranks;
    if (simulatePeers_) {
      for (int mirror = 0; mirror < nranks; ++mirror) {
        split.chosen[mirror] = {color, key};
      }
    }
    split.chosen[rank] = {color, key};
  }
  changed_.notify_all();
}

std::optional<FakeNcclWorld::SplitPlace> FakeNcclWorld::splitPlace(uint64_t parent, int nth,
                                                                   int rank) const {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  const auto found = splits_.find({parent, nth});
  if (found == splits_.end() ||
      static_cast<int>(found->second.chosen.size()) < found->second.nranks) {
    return std::nullopt;
  }
  const auto& chosen = found->second.chosen;
  const auto [color, key] = chosen.at(rank);
  if (color == NCCL_SPLIT_NOCOLOR) {
    return SplitPlace{};
  }
  SplitPlace place;
  // The same for every member of the new one, and never a unique id's or a shrink's.
  place.key =
      (parent * 1000033 + static_cast<uint64_t>(nth) * 7919 + static_cast<uint64_t>(color) + 1) |
      (uint64_t{3} << 62);
  for (const auto& [other, choice] : chosen) {
    if (choice.first != color) {
      continue;
    }
    ++place.nranks;
    if (std::make_pair(choice.second, other) < std::make_pair(key, rank)) {
      ++place.rank;
    }
  }
  return place;
}

void FakeNcclWorld::join(uint64_t key, int rank, int nranks, FakeGpu* gpu) {
  {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    Meeting& meeting = meetings_[key];
    meeting.nranks = nranks;
    meeting.joined = simulatePeers_ ? nranks : meeting.joined + 1;
    meeting.gpus[rank] = gpu;
  }
  changed_.notify_all();
}

bool FakeNcclWorld::complete(uint64_t key) const {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  auto found = meetings_.find(key);
  return found != meetings_.end() && found->second.joined >= found->second.nranks;
}

bool FakeNcclWorld::waitComplete(uint64_t key, std::chrono::milliseconds timeout) {
  std::unique_lock<std::recursive_mutex> lock(mutex_);
  return changed_.wait_for(lock, timeout, [&] {
    const Meeting& meeting = meetings_[key];
    return meeting.joined >= meeting.nranks;
  });
}

void FakeNcclWorld::number(NcclLaunch& launch) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  Meeting& meeting = meetings_[launch.comm];
  for (NcclOp& op : launch.ops) {
    if (op.collective()) {
      op.index = meeting.collectives[launch.rank]++;
    } else if (op.kind == NcclOp::Kind::Send) {
      op.index = meeting.sends[{launch.rank, op.root}]++;
    } else {
      op.index = meeting.recvs[{op.root, launch.rank}]++;
    }
  }
}

void FakeNcclWorld::holdForGraph(uint64_t key, int rank, int change) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  meetings_[key].graphs[rank] += change;
  changed_.notify_all();
}

int FakeNcclWorld::graphsHolding(uint64_t key, int rank) const {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  const auto meeting = meetings_.find(key);
  if (meeting == meetings_.end()) {
    return 0;
  }
  const auto graphs = meeting->second.graphs.find(rank);
  return graphs == meeting->second.graphs.end() ? 0 : graphs->second;
}

void FakeNcclWorld::finalizing(uint64_t key, int rank) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  meetings_[key].finalizing.insert(rank);
}

bool FakeNcclWorld::allFinalizing(uint64_t key) const {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  const auto meeting = meetings_.find(key);
  return simulatePeers_ ||
         (meeting != meetings_.end() &&
          static_cast<int>(meeting->second.finalizing.size()) >= meeting->second.nranks);
}

void FakeNcclWorld::markDestroyed(uint64_t key, int rank) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  meetings_[key].destroyed.insert(rank);
}

void FakeNcclWorld::checkNotDestroyed(FakeGpu& gpu, StreamId stream, const Item& item) {
  const auto meeting = meetings_.find(item.launch->comm);
  if (meeting != meetings_.end() && meeting->second.destroyed.count(item.launch->rank) > 0) {
    gpu.log().violation(item.name + " of " + item.launch->commName + " ran on S" +
                        std::to_string(stream) +
                        " after ncclCommDestroy freed the communicator (a use after free)");
  }
}

void FakeNcclWorld::notify() { changed_.notify_all(); }

void FakeNcclWorld::loop() {
  std::unique_lock<std::recursive_mutex> lock(mutex_);
  while (!stopping_) {
    advance();
    // Woken by new work; the period only bounds a missed wake-up.
    changed_.wait_for(lock, std::chrono::milliseconds(2));
  }
}

void FakeNcclWorld::advance() {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  bool progressed = true;
  while (progressed) {
    progressed = false;
    for (FakeGpu* gpu : gpus_) {
      for (const auto& [stream, item] : gpu->heads()) {
        const bool ran = item->kind == Item::Kind::Nccl && !item->launch->stopped &&
                                 models_.peers && !simulatePeers_
                             ? runWithPeers(*gpu, stream, *item)
                             : gpu->runHead(stream);
        if (ran) {
          progressed = true;
          break;  // the heads have changed
        }
      }
    }
  }
  changed_.notify_all();
}

template <typename Match>
std::optional<FakeNcclWorld::Member> FakeNcclWorld::findHead(uint64_t comm, int rank, Match match) {
  auto meeting = meetings_.find(comm);
  if (meeting == meetings_.end()) {
    return std::nullopt;
  }
  auto gpu = meeting->second.gpus.find(rank);
  if (gpu == meeting->second.gpus.end() || gpus_.count(gpu->second) == 0) {
    return std::nullopt;
  }
  for (const auto& [stream, item] : gpu->second->heads()) {
    if (item->kind != Item::Kind::Nccl || item->launch->stopped || item->launch->comm != comm ||
        item->launch->rank != rank) {
      continue;
    }
    for (const NcclOp& op : item->launch->ops) {
      if (match(op)) {
        return Member{gpu->second, stream, item};
      }
    }
  }
  return std::nullopt;
}

std::optional<std::vector<FakeNcclWorld::Member>> FakeNcclWorld::runningWith(FakeGpu& gpu,
                                                                             StreamId stream,
                                                                             const Item& item) {
  // This kernel, and transitively every peer kernel one of them needs. Each must be first on
  // its stream (its GPU's queue); else none runs yet.
  std::vector<Member> members{{&gpu, stream, &item}};
  std::set<const Item*> seen{&item};
  for (size_t next = 0; next < members.size(); ++next) {
    const NcclLaunch& launch = *members[next].item->launch;
    for (const NcclOp& op : launch.ops) {
      std::vector<std::optional<Member>> partners;
      if (op.collective()) {
        for (int peer = 0; peer < launch.nranks; ++peer) {
          if (peer != launch.rank) {
            partners.push_back(findHead(launch.comm, peer, [&](const NcclOp& theirs) {
              return theirs.collective() && theirs.index == op.index;
            }));
          }
        }
      } else {
        const auto wanted = op.kind == NcclOp::Kind::Send ? NcclOp::Kind::Recv : NcclOp::Kind::Send;
        partners.push_back(findHead(launch.comm, op.root, [&](const NcclOp& theirs) {
          return theirs.kind == wanted && theirs.root == launch.rank && theirs.index == op.index;
        }));
      }
      for (const auto& partner : partners) {
        if (!partner) {
          return std::nullopt;
        }
        if (seen.insert(partner->item).second) {
          members.push_back(*partner);
        }
      }
    }
  }
  return members;
}

bool FakeNcclWorld::runWithPeers(FakeGpu& gpu, StreamId stream, const Item& item) {
  const std::optional<std::vector<Member>> together = runningWith(gpu, stream, item);
  if (!together) {
    return false;
  }
  const std::vector<Member>& members = *together;
  // They all run now: first the buffer checks, then the data, member by member (none if a
  // buffer is gone for good: there is nothing left to read or write).
  bool intact = true;
  for (const Member& member : members) {
    checkNotDestroyed(*member.gpu, member.stream, *member.item);
    intact = member.gpu->checkBuffers(member.stream, *member.item, "ran") && intact;
    for (const NcclOp& op : member.item->launch->ops) {
      intact = intact && !op.outOfBounds;
    }
  }
  std::map<std::pair<uint64_t, uint64_t>, std::map<int, const NcclOp*>> collectives;
  std::map<std::tuple<int, int, uint64_t>, const NcclOp*> sends;
  std::vector<std::pair<int, const NcclOp*>> recvs;
  for (const Member& member : members) {
    const NcclLaunch& launch = *member.item->launch;
    for (const NcclOp& op : launch.ops) {
      if (op.collective()) {
        collectives[{launch.comm, op.index}][launch.rank] = &op;
      } else if (op.kind == NcclOp::Kind::Send) {
        sends[{launch.rank, op.root, op.index}] = &op;
      } else {
        recvs.emplace_back(launch.rank, &op);
      }
    }
  }
  if (intact) {
    FakeMemory::Untracked fakesOwn;
    for (const auto& [index, byRank] : collectives) {
      std::vector<const NcclOp*> ops;
      bool agreed = true;
      for (const auto& [rank, op] : byRank) {
        const NcclOp& first = *byRank.begin()->second;
        // (A PreMulSum op is made per member, under a number of its own: not compared.)
        const bool rooted =
            first.kind == NcclOp::Kind::Broadcast || first.kind == NcclOp::Kind::Reduce;
        const bool builtInOps = op->op < ncclNumOps && first.op < ncclNumOps;
        if (op->kind != first.kind || op->count != first.count || op->type != first.type ||
            (rooted && op->root != first.root) || (builtInOps && op->op != first.op)) {
          // As NCCL, which would hang or move garbage: the fake moves nothing, and reads no
          // member's buffer past the count that member gave.
          gpu.log().violation(
              "members issued different collectives (kind, count, type, root or reduction) as "
              "operation #" +
              std::to_string(index.second) + " of a communicator");
          agreed = false;
        }
        ops.push_back(op);
      }
      if (agreed) {
        runCollective(ops);
      }
    }
    for (const auto& [rank, recv] : recvs) {
      runMessage(*sends.at({recv->root, rank, recv->index}), *recv);
    }
  }
  for (const Member& member : members) {
    member.gpu->popHead(member.stream);
  }
  return true;
}

}  // namespace streamnccl::fake
