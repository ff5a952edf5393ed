#pragma once
// Context parallelism's attention (cp ranks split every sequence): ring attention (Liu et al.
// 2023) with the causal load balance of Megatron-Core and TransformerEngine. The sequence of T
// tokens is cut into 2 cp chunks of c = T / (2 cp); rank r holds chunks r and 2cp-1-r, in that
// order, as its Tl = T / cp local rows (cp_positions gives their positions). Every rank then
// does the same attention work: at ring step 0 a rank attends its own rows causally (chunk r
// to itself, chunk 2cp-1-r to itself and to chunk r); at step i > 0 it holds the keys and
// values of rank j = r - i (mod cp): when j < r its whole query attends to j's first chunk,
// when j > r its second chunk attends to both of j's. Partial outputs merge by their
// log-sum-exps (kernels/attention/attention_block.hpp).
//
// ring: the keys and values (of the kv heads only: grouped-query attention sends NKV heads)
// pass to the next rank while the block in hand is computed; the backward sends them round
// again with their gradient accumulators, which arrive back at their owner after cp hops.
// all_gather: every rank gathers all keys and values first (one all-gather; TorchTitan's
// choice for small cp), attends, and reduce-scatters their gradients.
// Both are exact: the same numbers as one rank's causal attention up to summation order.
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "meshtrain/comm/communicator.hpp"
#include "meshtrain/core/view.hpp"

namespace meshtrain::model {

enum class CpComm { ring, all_gather };
CpComm parse_cp_comm(const std::string& text);  // "ring" | "all_gather"; ConfigError: cp.comm
const char* cp_comm_name(CpComm c);

// The global positions of rank r's Tl = T / cp rows (T divisible by 2 cp).
std::vector<int> cp_positions(int T, int cp, int r);

// Bytes of the buffers RingAttention keeps once it has run a forward and a backward (for the
// memory footprint): inputs of `elem_bytes`, accumulators in fp32 (fp64 when elem_bytes is 8).
std::size_t ring_attention_bytes(CpComm how, int cp, std::size_t B, std::size_t Tl,
                                 std::size_t NH, std::size_t NKV, std::size_t HS,
                                 std::size_t elem_bytes);

template <class T>
class RingAttention {
 public:
  using A = std::conditional_t<std::is_same_v<T, double>, double, float>;  // accumulation
  // `cp`: the context-parallel group (rank = cp coordinate). B sequences of Tl local rows, NH
  // query and NKV key/value heads of HS (the local heads under tp). Collective over cp (its
  // point-to-point links are prepared).
  RingAttention(comm::Communicator& cp, CpComm how, int B, int Tl, int NH, int NKV, int HS,
                ExecSpace exec);
  ~RingAttention();
  RingAttention(const RingAttention&) = delete;
  RingAttention& operator=(const RingAttention&) = delete;

  // out [B, Tl, NH HS] and lse [B, NH, Tl] (the merged log-sum-exp, what the backward needs)
  // from the local packed qkv [B, Tl, (NH + 2 NKV) HS], rows as attention.hpp lays them out.
  void forward(View1<T> out, View1<float> lse, View1<const T> qkv);
  // dqkv [B, Tl, (NH + 2 NKV) HS] (overwritten) from dout and the forward's qkv, out, lse.
  void backward(View1<T> dqkv, View1<const T> dout, View1<const T> qkv, View1<const T> out,
                View1<const float> lse);

  // Bytes of the buffers it keeps now (ring_attention_bytes once both passes have run).
  std::size_t bytes() const;
  // Seconds the ring spent waiting for a message after its compute (the unhidden share).
  double wait_seconds() const { return wait_s_; }
  double comm_bytes() const { return comm_bytes_; }

 private:
  void block_forward(int src, View1<const T> k_buf, View1<const T> v_buf, std::int64_t k_off,
                     std::int64_t v_off, std::int64_t kv_row, View1<const T> qkv);
  void block_backward(int src, View1<const T> k_buf, View1<const T> v_buf, std::int64_t k_off,
                      std::int64_t v_off, std::int64_t kv_row, View1<A> dkv, View1<const T> qkv,
                      View1<const T> dout, View1<const T> out);
  void forward_all_gather(View1<const T> qkv);
  void backward_all_gather(View1<A> dqkv_acc, View1<const T> qkv, View1<const T> dout);

  comm::Communicator& cp_;
  CpComm how_;
  int B_, Tl_, NH_, NKV_, HS_;
  int r_, n_;  // cp rank and size
  ExecSpace exec_;
  // forward state and ring buffers
  View1<A> acc_, acc_lse_, blk_, blk_lse_;  // merged output / lse, a block's partial
  View1<T> kv_[2];                          // [B, Tl, 2 NKV HS]: k | v of a source, double-buffered
  View1<A> dkv_[2];                         // their gradient accumulators
  View1<A> dq_, D_;                         // backward: dq accumulator, rowdot(dO, O)
  View1<T> kv_all_;                         // all_gather: [cp, B, Tl, 2 NKV HS]
  View1<A> dkv_all_;
  double wait_s_ = 0, comm_bytes_ = 0;
};

}  // namespace meshtrain::model
