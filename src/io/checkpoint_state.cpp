// The /state group of a checkpoint: small replicated tensors that are not parameters
// (CheckpointAttributes::state, e.g. the sigmoid routers' expert biases). Each is a 1-D float32
// dataset with the same layout-free checksum as the parameters. They are replicated, so rank 0's
// values are the file's: the writer broadcasts them, creates the datasets collectively and rank 0
// alone transfers data (a collective write in which the other ranks select nothing).
#include <cstring>

#include "checkpoint_common.hpp"

namespace meshtrain::io::ckpt {

namespace {

constexpr const char* kStateGroup = "/state";

std::uint64_t state_checksum(const std::vector<float>& v) {
  std::uint64_t sum = 0;
  for (std::size_t i = 0; i < v.size(); ++i) {
    std::uint32_t bits = 0;
    std::memcpy(&bits, &v[i], sizeof bits);
    sum += checksum_term(i, bits);
  }
  return sum;
}

template <class X>
void put(std::string& s, const X& x) {
  s.append(reinterpret_cast<const char*>(&x), sizeof x);
}

template <class X>
X take(const std::string& s, std::size_t& at) {
  MESHTRAIN_CHECK(at + sizeof(X) <= s.size(), "checkpoint state: a truncated broadcast");
  X x;
  std::memcpy(&x, s.data() + at, sizeof x);
  at += sizeof x;
  return x;
}

}  // namespace

void broadcast_state(MPI_Comm comm, CheckpointState& state) {
  std::string s;
  put(s, static_cast<std::uint64_t>(state.size()));
  for (const auto& [key, v] : state) {
    put(s, static_cast<std::uint64_t>(key.size()));
    s += key;
    put(s, static_cast<std::uint64_t>(v.size()));
    s.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  }
  broadcast_string(comm, s);
  CheckpointState out;
  std::size_t at = 0;
  const auto n = take<std::uint64_t>(s, at);
  for (std::uint64_t i = 0; i < n; ++i) {
    const auto klen = take<std::uint64_t>(s, at);
    std::string key = s.substr(at, klen);
    at += klen;
    std::vector<float> v(take<std::uint64_t>(s, at));
    MESHTRAIN_CHECK(at + v.size() * sizeof(float) <= s.size(),
                    "checkpoint state: a truncated broadcast");
    std::memcpy(v.data(), s.data() + at, v.size() * sizeof(float));
    at += v.size() * sizeof(float);
    out.emplace(std::move(key), std::move(v));
  }
  state = std::move(out);
}

void write_state(hid_t file, const CheckpointState& state, bool root, hid_t collective) {
  if (state.empty()) return;
  h5::Handle grp(MESHTRAIN_H5_CHECK(H5Gcreate2(file, kStateGroup, H5P_DEFAULT, H5P_DEFAULT,
                                               H5P_DEFAULT)),
                 H5Gclose);
  h5::write_attr(grp, "description", std::string("replicated model state that is not a parameter "
                                                 "(float32, e.g. the routers' expert biases)"));
  for (const auto& [key, v] : state) {
    const hsize_t n = v.size();
    h5::Handle space(MESHTRAIN_H5_CHECK(H5Screate_simple(1, &n, nullptr)), H5Sclose);
    h5::Handle d(MESHTRAIN_H5_CHECK(H5Dcreate2(grp, key.c_str(), H5T_IEEE_F32LE, space,
                                               H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)),
                 H5Dclose);
    h5::write_attr(d, "checksum", state_checksum(v));
    h5::Handle fsel = root ? h5::Handle(MESHTRAIN_H5_CHECK(H5Scopy(space)), H5Sclose)
                           : empty_selection(space);
    h5::Handle msp = memory_space(root ? v.size() : 0);
    const float dummy = 0.0f;
    MESHTRAIN_H5_CHECK(H5Dwrite(d, H5T_NATIVE_FLOAT, msp, fsel, collective,
                                root && !v.empty() ? v.data() : &dummy));
  }
}

CheckpointState read_state(hid_t file, const std::string& where, bool verify) {
  CheckpointState state;
  if (MESHTRAIN_H5_CHECK(H5Lexists(file, kStateGroup, H5P_DEFAULT)) <= 0) return state;
  h5::Handle grp(MESHTRAIN_H5_CHECK(H5Gopen2(file, kStateGroup, H5P_DEFAULT)), H5Gclose);
  H5G_info_t info;
  MESHTRAIN_H5_CHECK(H5Gget_info(grp, &info));
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    const ssize_t len = MESHTRAIN_H5_CHECK(
        H5Lget_name_by_idx(grp, ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT));
    std::string key(static_cast<std::size_t>(len) + 1, '\0');
    MESHTRAIN_H5_CHECK(H5Lget_name_by_idx(grp, ".", H5_INDEX_NAME, H5_ITER_INC, i, key.data(),
                                          key.size(), H5P_DEFAULT));
    key.resize(static_cast<std::size_t>(len));
    h5::Handle d(MESHTRAIN_H5_CHECK(H5Dopen2(grp, key.c_str(), H5P_DEFAULT)), H5Dclose);
    h5::Handle s(MESHTRAIN_H5_CHECK(H5Dget_space(d)), H5Sclose);
    const hssize_t n = MESHTRAIN_H5_CHECK(H5Sget_simple_extent_npoints(s));
    std::vector<float> v(static_cast<std::size_t>(n));
    // Independent: every rank reads the whole (small) tensor on its own.
    if (n > 0) MESHTRAIN_H5_CHECK(H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()));
    if (verify && state_checksum(v) != h5::read_attr_u64(d, "checksum", where))
      throw ConfigError(cat(where, " is corrupt: the checksum of ", kStateGroup, "/", key,
                            " does not match its data; restore an earlier checkpoint"));
    state.emplace(std::move(key), std::move(v));
  }
  return state;
}

}  // namespace meshtrain::io::ckpt
