# Tests of the train layer: meshtrain_add_test(...) lines.
