// --attn.impl / --attn.deterministic: the process-wide choice of attention backend
// (meshtrain/kernels/attention/attention.hpp). Compiled in every build.
#include "meshtrain/core/error.hpp"
#include "meshtrain/kernels/attention/attention.hpp"

namespace meshtrain::kernels {

namespace {
AttentionOptions g_options;
}  // namespace

void set_attention_options(const AttentionOptions& options) { g_options = options; }
const AttentionOptions& attention_options() { return g_options; }

AttentionImpl parse_attention_impl(const std::string& text, const std::string& option) {
  if (text == "auto") return AttentionImpl::automatic;
  if (text == "cudnn") return AttentionImpl::cudnn;
  if (text == "meshtrain") return AttentionImpl::meshtrain;
  throw ConfigError(cat(option, "='", text, "' is not one of auto, cudnn, meshtrain"));
}

const char* to_string(AttentionImpl impl) {
  switch (impl) {
    case AttentionImpl::automatic: return "auto";
    case AttentionImpl::cudnn: return "cudnn";
    case AttentionImpl::meshtrain: return "meshtrain";
  }
  return "?";
}

#if !(defined(KOKKOS_ENABLE_CUDA) && defined(MESHTRAIN_HAVE_CUDNN))
std::string cudnn_attention_unavailable_reason() {
#if defined(KOKKOS_ENABLE_CUDA)
  return "this build has no cuDNN support (configure with -DMESHTRAIN_ENABLE_CUDNN=ON)";
#else
  return "cuDNN attention needs the CUDA build (this one runs on the host)";
#endif
}
#endif

}  // namespace meshtrain::kernels
