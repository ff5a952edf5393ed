#pragma once
// A run of a flat parameter buffer whose elements take the same AdamW weight decay: what the
// model's registry gives the optimizer, so that the optimizer needs no model.
#include <cstddef>

namespace meshtrain {

struct DecayRange {
  std::size_t offset = 0, length = 0;
  bool decay = false;
};

}  // namespace meshtrain
