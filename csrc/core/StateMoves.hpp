#pragma once

// The one helper of every lifecycle written as states (a group's health and teardown, a
// communicator's connecting and end, an op's outcome): each keeps its legal moves as a table of
// (from, to) pairs beside its enum, and asserts every move against it.

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstddef>
#include <iterator>
#include <utility>

namespace streamnccl {

template <typename State, size_t N>
constexpr bool legalMove(const std::pair<State, State> (&moves)[N], State from, State to) {
  return std::find(std::begin(moves), std::end(moves), std::make_pair(from, to)) != std::end(moves);
}

// Moves `state` to `to`, asserting that the table allows it; `what` names the lifecycle in the
// internal error an illegal move raises (a defect of streamnccl, never of its user).
template <typename State, size_t N>
void moveState(State& state, State to, const std::pair<State, State> (&moves)[N],
               const char* what) {
  TORCH_INTERNAL_ASSERT(legalMove(moves, state, to), "streamnccl: illegal move of ", what,
                        " from state ", static_cast<int>(state), " to ", static_cast<int>(to));
  state = to;
}

}  // namespace streamnccl
