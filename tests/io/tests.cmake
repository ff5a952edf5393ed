# Tests of the io layer: meshtrain_add_test(...) lines.
