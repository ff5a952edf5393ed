#include "meshtrain/core/fault_injection.hpp"

namespace meshtrain::fault {

Hooks& hooks() {
  static Hooks h;
  return h;
}

}  // namespace meshtrain::fault
