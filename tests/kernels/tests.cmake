# Tests of the kernels layer: meshtrain_add_test(...) lines.
