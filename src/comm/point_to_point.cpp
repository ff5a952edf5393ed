// The point-to-point contract every backend keeps: messages go only to and from peers that
// prepare_p2p has prepared (see communicator.hpp for why NCCL needs it).
#include <algorithm>

#include "meshtrain/comm/communicator.hpp"

namespace meshtrain::comm {

namespace {

void check_in_group(const char* op, int peer, int size) {
  if (peer < 0 || peer >= size)
    throw_error(cat("comm::", op, ": peer ", peer, " of a group of ", size), __FILE__, __LINE__);
}

}  // namespace

void Communicator::prepare_p2p(const std::vector<int>& peers) {
  std::vector<int> fresh;
  for (int p : peers) {
    check_in_group("prepare_p2p", p, size());
    if (!p2p_prepared(p)) fresh.push_back(p);
  }
  std::sort(fresh.begin(), fresh.end());
  fresh.erase(std::unique(fresh.begin(), fresh.end()), fresh.end());
  // Messages to itself (an interleaved pipeline of one stage) need no connection.
  std::vector<int> others;
  for (int p : fresh)
    if (p != rank()) others.push_back(p);
  open_p2p(others);
  p2p_peers_.insert(p2p_peers_.end(), fresh.begin(), fresh.end());
  std::sort(p2p_peers_.begin(), p2p_peers_.end());
}

bool Communicator::p2p_prepared(int peer) const {
  return std::binary_search(p2p_peers_.begin(), p2p_peers_.end(), peer);
}

void Communicator::check_p2p_peer(const char* op, int peer) const {
  check_in_group(op, peer, size());
  if (!p2p_prepared(peer))
    throw_error(cat("comm::", op, ": rank ", rank(), " has not prepared point-to-point messages "
                    "with peer ", peer, " (call prepare_p2p({...}) on every rank of the pair "
                    "first: on NCCL an unprepared receive posted before its send, or two pairs "
                    "connecting in different orders, hang)"),
                __FILE__, __LINE__);
}

}  // namespace meshtrain::comm
